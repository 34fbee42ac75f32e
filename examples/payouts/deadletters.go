package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemflow/idemflow/examples/payouts/payout"
	"github.com/idemflow/idemflow/phases"
)

const deadLettersUsage = `usage: payouts dead-letters <list|replay> [flags]

  list     print the messages the consumer gave up on, oldest first
  replay   publish dead letters again to their subject (-id N, or -all for every one
           never replayed), each under a new Nats-Msg-Id
`

// deadLettersCmd lists or replays the messages the consumer gave up on.
func deadLettersCmd(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, deadLettersUsage)
		return flag.ErrHelp
	}
	switch args[0] {
	case "list":
		return listDeadLetters(ctx, args[1:], out)
	case "replay":
		return replayDeadLetters(ctx, args[1:], out)
	}
	fmt.Fprint(os.Stderr, deadLettersUsage)
	return fmt.Errorf("unknown dead-letters command %q", args[0])
}

func listDeadLetters(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("dead-letters list", flag.ContinueOnError)
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "Postgres URL of the consumer (default $DATABASE_URL)")
	after := fs.Int64("after", 0, "list dead letters with an id above this")
	limit := fs.Int("limit", 100, "at most this many (1-10000)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" {
		return errors.New("-database-url is required")
	}
	if *limit < 1 || *limit > 10000 || *after < 0 {
		return fmt.Errorf("-limit %d or -after %d is out of range", *limit, *after)
	}
	pool, closeDB, err := openDB(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer closeDB()
	list, err := payout.ListDeadLetters(ctx, pool, *after, *limit)
	if err != nil {
		return err
	}
	for _, d := range list {
		replayed := "never"
		if d.ReplayedAt != nil {
			replayed = d.ReplayedAt.UTC().Format(time.RFC3339)
		}
		// Quoted: the body, the message id and the reason carry a sender's text.
		fmt.Fprintf(out, "id=%d stream=%s seq=%d subject=%s msg_id=%s delivered=%d at=%s replays=%d replayed=%s reason=%s data=%s\n",
			d.ID, strconv.QuoteToASCII(d.Stream), d.StreamSeq, strconv.QuoteToASCII(d.Subject), strconv.QuoteToASCII(string(d.MsgID)),
			d.Delivered, d.CreatedAt.UTC().Format(time.RFC3339), d.Replays, replayed,
			strconv.QuoteToASCII(d.Reason), strconv.QuoteToASCII(string(d.Data)))
	}
	fmt.Fprintf(out, "%d dead letters\n", len(list))
	return nil
}

func replayDeadLetters(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("dead-letters replay", flag.ContinueOnError)
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "Postgres URL of the consumer (default $DATABASE_URL)")
	natsURL := fs.String("nats-url", defaultNATSURL(), "NATS server URL (default $NATS_URL, else this)")
	id := fs.Int64("id", 0, "the dead letter to replay")
	all := fs.Bool("all", false, "replay every dead letter never replayed")
	subject := fs.String("subject", "", "publish to this subject instead of the dead letter's own")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" || (*id <= 0) == !*all {
		return errors.New("-database-url and one of -id N or -all are required")
	}
	pool, closeDB, err := openDB(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer closeDB()
	var todo []payout.DeadLetter
	if *all {
		for after := int64(0); ; {
			page, err := payout.ListDeadLetters(ctx, pool, after, 1000)
			if err != nil {
				return err
			}
			for _, d := range page {
				if d.Replays == 0 {
					todo = append(todo, d)
				}
			}
			if len(page) < 1000 {
				break
			}
			after = page[len(page)-1].ID
		}
	} else {
		d, err := payout.GetDeadLetter(ctx, pool, *id)
		if err != nil {
			return err
		}
		todo = append(todo, d)
	}
	nc, err := nats.Connect(*natsURL, nats.Name("payouts-dead-letters"))
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w", *natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	for _, d := range todo {
		if err := replayOne(ctx, js, pool, d, *subject, out); err != nil {
			return err
		}
	}
	return nil
}

// replayOne publishes d as its next replay, then records the replay. A crash between
// the two publishes the same Nats-Msg-Id again on the next run, which the stream's
// duplicate window drops.
func replayOne(ctx context.Context, js jetstream.JetStream, db phases.DBTX, d payout.DeadLetter, subject string, out io.Writer) error {
	if subject == "" {
		subject = d.Subject
	}
	n := d.Replays + 1
	msgID := payout.ReplayMsgID(d.ID, n)
	ack, err := js.Publish(ctx, subject, d.Data, jetstream.WithMsgID(msgID))
	if err != nil {
		return fmt.Errorf("replay dead letter %d: %w", d.ID, err)
	}
	if _, err := payout.MarkReplayed(ctx, db, d.ID, n); err != nil {
		return err
	}
	fmt.Fprintf(out, "replayed id=%d as msg_id=%s stream=%s seq=%d duplicate=%v\n", d.ID, msgID, ack.Stream, ack.Sequence, ack.Duplicate)
	return nil
}

func defaultNATSURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}
