package vocab

import (
	"context"
	"errors"
	"fmt"
	"go/token"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/gosource"
)

// classOf is every sentinel of the package with its class. A sentinel added to the
// package without an entry here fails TestEverySentinelHasAClass: classing it is part
// of adding it.
var classOf = map[string]struct {
	err   error
	class Class
}{
	"ErrInvalidKey":           {ErrInvalidKey, ClassClientFault},
	"ErrInvalidScope":         {ErrInvalidScope, ClassClientFault},
	"ErrControlCharacter":     {ErrControlCharacter, ClassClientFault},
	"ErrInvalidRequest":       {ErrInvalidRequest, ClassClientFault},
	"ErrBodyNotJSON":          {ErrBodyNotJSON, ClassClientFault},
	"ErrBodyTooLarge":         {ErrBodyTooLarge, ClassClientFault},
	"ErrMismatch":             {ErrMismatch, ClassClientFault},
	"ErrNotFound":             {ErrNotFound, ClassClientFault},
	"ErrInProgress":           {ErrInProgress, ClassRetry},
	"ErrNewerFormat":          {ErrNewerFormat, ClassRetry},
	"ErrUnknownRecoveryPoint": {ErrUnknownRecoveryPoint, ClassRetry},
	"ErrTransient":            {ErrTransient, ClassRetry},
	"ErrLeaseExpired":         {ErrLeaseExpired, ClassRetry},
	"ErrLeaseLost":            {ErrLeaseLost, ClassRetry},
	"ErrClaimBusy":            {ErrClaimBusy, ClassRetry},
	"ErrClaimExists":          {ErrClaimExists, ClassRetry},
	"ErrConflict":             {ErrConflict, ClassRetry},
	"ErrUnavailable":          {ErrUnavailable, ClassRetry},
	"ErrOverloaded":           {ErrOverloaded, ClassRetry},
	"ErrDraining":             {ErrDraining, ClassRetry},
	"ErrStandbyBehind":        {ErrStandbyBehind, ClassRetry},
	"ErrDeadLettered":         {ErrDeadLettered, ClassDeadLettered},
	"ErrResponseTooLarge":     {ErrResponseTooLarge, ClassServerFault},
	"ErrPhaseDataTooLarge":    {ErrPhaseDataTooLarge, ClassServerFault},
	"ErrNoResponse":           {ErrNoResponse, ClassServerFault},
	"ErrNotFinal":             {ErrNotFinal, ClassServerFault},
	"ErrUnstorable":           {ErrUnstorable, ClassServerFault},
	"ErrNeedsClient":          {ErrNeedsClient, ClassServerFault},
	"ErrUnknownFlow":          {ErrUnknownFlow, ClassServerFault},
	"ErrOpenSealed":           {ErrOpenSealed, ClassServerFault},
	"ErrMisconfigured":        {ErrMisconfigured, ClassServerFault},
	"ErrRefused":              {ErrRefused, ClassServerFault},
	// The operator API's.
	"ErrUnknownStatus":       {ErrUnknownStatus, ClassClientFault},
	"ErrWrongStatus":         {ErrWrongStatus, ClassClientFault},
	"ErrInvalidCursor":       {ErrInvalidCursor, ClassClientFault},
	"ErrEmptyFilter":         {ErrEmptyFilter, ClassClientFault},
	"ErrCallMayHaveRun":      {ErrCallMayHaveRun, ClassClientFault},
	"ErrCompensationUnknown": {ErrCompensationUnknown, ClassClientFault},
	"ErrCompensationFailed":  {ErrCompensationFailed, ClassServerFault},
}

// sentinels returns the names of the package's exported error variables, read from
// its source.
func sentinels(t *testing.T) []string {
	t.Helper()
	return gosource.ExportedVars(gosource.Files(t, token.NewFileSet(), "."))
}

func TestEverySentinelHasAClass(t *testing.T) {
	t.Parallel()
	names := sentinels(t)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, ok := classOf[name]
			require.True(t, ok, "%s has no class in classOf: decide its class (see Class) and add it", name)
			require.Equal(t, c.class, Classify(c.err), "%s", name)
			require.Equal(t, c.class, Classify(fmt.Errorf("workflow: run: %w", c.err)), "%s, wrapped", name)
			require.NotEqual(t, ClassNone, c.class)
			require.Contains(t, Sentinels(), c.err, "%s is not in Sentinels", name)
		})
	}
	require.Len(t, names, len(classOf), "the exported variables of the package are its sentinels, each classed here")
	require.Len(t, Sentinels(), len(classOf), "Sentinels lists each sentinel once")
}

func TestClassifyPrecedence(t *testing.T) {
	t.Parallel()
	transient := func(cause error) error {
		return &TransientError{Phase: "charge", RetryAfter: 2e9, Err: cause}
	}
	for _, c := range []struct {
		name string
		err  error
		want Class
	}{
		{"Nil", nil, ClassNone},
		{"Unknown", errors.New("something internal"), ClassServerFault},
		{"InProgressError", &InProgressError{RetryAfter: 1e9}, ClassRetry},
		{"Shed", &ShedError{RetryAfter: 1e9, Err: ErrOverloaded}, ClassRetry},
		{"Canceled", context.Canceled, ClassRetry},
		{"DeadlineExceeded", fmt.Errorf("look up key: %w", context.DeadlineExceeded), ClassRetry},
		{"Panic", &phases.PanicError{Value: "boom"}, ClassServerFault},
		// A transient failure is a retry whatever its cause, but a fault of the flow,
		// the wiring or the configuration: the engine released the key, a retry runs
		// it again.
		{"TransientOwnCause", transient(errors.New("provider down")), ClassRetry},
		{"TransientClientLooking", transient(fmt.Errorf("provider: %w", ErrInvalidRequest)), ClassRetry},
		{"TransientDatabase", transient(ErrUnavailable), ClassRetry},
		{"TransientPanic", transient(&phases.PanicError{Value: "boom"}), ClassServerFault},
		{"TransientTooLarge", transient(ErrResponseTooLarge), ClassServerFault},
		{"TransientMisconfigured", transient(ErrMisconfigured), ClassServerFault},
		{"TransientNotFinal", transient(ErrNotFinal), ClassServerFault},
		{"ControlCharacterKey", fmt.Errorf("%w: %w at byte 3", ErrInvalidKey, ErrControlCharacter), ClassClientFault},
		{"DeadLetteredUnstorable", fmt.Errorf("%w: %v", ErrDeadLettered, ErrUnstorable), ClassDeadLettered},
		{"NewerRecoveryPoint", fmt.Errorf("%w (%w): no phase", ErrUnknownRecoveryPoint, ErrNewerFormat), ClassRetry},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, c.want, Classify(c.err))
		})
	}
}

func TestClassString(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for c := ClassNone; c <= ClassServerFault; c++ {
		s := c.String()
		require.NotContains(t, s, "invalid")
		require.False(t, seen[s], "%s named twice", s)
		seen[s] = true
	}
	require.Equal(t, "Class(invalid)", (ClassServerFault + 1).String())
}
