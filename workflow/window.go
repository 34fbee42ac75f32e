package workflow

import (
	"fmt"
	"strings"
	"time"
)

// DailyWindow is a span of every day, by the clock of UTC: from From, included, to To,
// excluded, each an offset from midnight in whole minutes under 24h. A window whose
// From is after its To runs over midnight (22:00 to 02:00). The zero value, and only
// it, is the whole day.
type DailyWindow struct {
	From, To time.Duration
}

// Contains reports whether t is in the window.
func (w DailyWindow) Contains(t time.Time) bool {
	if w == (DailyWindow{}) {
		return true
	}
	t = t.UTC()
	at := time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute +
		time.Duration(t.Second())*time.Second + time.Duration(t.Nanosecond())
	if w.From < w.To {
		return at >= w.From && at < w.To
	}
	return at >= w.From || at < w.To
}

// String is the window as HH:MM-HH:MM UTC, or "any time".
func (w DailyWindow) String() string {
	if w == (DailyWindow{}) {
		return "any time"
	}
	return w.text() + " UTC"
}

// text is the window as HH:MM-HH:MM.
func (w DailyWindow) text() string {
	hm := func(d time.Duration) string {
		return fmt.Sprintf("%02d:%02d", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return hm(w.From) + "-" + hm(w.To)
}

// MarshalText writes the window as HH:MM-HH:MM (UTC), and the whole day as nothing.
func (w DailyWindow) MarshalText() ([]byte, error) {
	if w == (DailyWindow{}) {
		return nil, nil
	}
	if err := w.validate(); err != nil {
		return nil, err
	}
	return []byte(w.text()), nil
}

// UnmarshalText reads HH:MM-HH:MM (UTC, 24-hour; 22:00-02:00 runs over midnight), or
// nothing for the whole day, as a flag (flag.TextVar) or a configuration file gives
// it. Anything else is an error, and w is left as it was.
func (w *DailyWindow) UnmarshalText(text []byte) error {
	if len(text) == 0 {
		*w = DailyWindow{}
		return nil
	}
	from, to, ok := strings.Cut(string(text), "-")
	var got DailyWindow
	var err error
	if ok {
		if got.From, err = timeOfDay(from); err == nil {
			got.To, err = timeOfDay(to)
		}
	}
	if !ok || err != nil {
		return fmt.Errorf("daily window %q: want HH:MM-HH:MM (UTC)", text)
	}
	if err := got.validate(); err != nil {
		return fmt.Errorf("daily window %q: %w", text, err)
	}
	*w = got
	return nil
}

// timeOfDay reads HH:MM as an offset from midnight.
func timeOfDay(s string) (time.Duration, error) {
	t, err := time.Parse("15:04", s)
	if err != nil || len(s) != len("15:04") {
		return 0, fmt.Errorf("%q is not HH:MM", s)
	}
	return time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute, nil
}

func (w DailyWindow) validate() error {
	for _, d := range []time.Duration{w.From, w.To} {
		if d < 0 || d >= 24*time.Hour || d%time.Minute != 0 {
			return fmt.Errorf("%s is not a time of day in whole minutes (0 to 23h59m)", d)
		}
	}
	if w.From == w.To && w != (DailyWindow{}) {
		return fmt.Errorf("an empty window (From and To both %s); the zero value is the whole day", w.From)
	}
	return nil
}
