// Command payouts is a NATS JetStream consumer built on idemflow: it consumes
// payouts.requested messages and runs each through a three-phase flow (record, a
// bank transfer under the derived key, settle in the ledger), acknowledging a message
// only once its answer is stored. Duplicates (the same Nats-Msg-Id, or the same
// payout under another message id), redeliveries after a crash or a lost ack, and
// competing consumers all end in one ledger row and one bank transfer per payout. An
// embedded sweeper finishes payouts that no redelivery comes back for. Keys are scoped
// by account (payout.Scope), every payout id is turned into a valid key (payout.Key),
// and a message the consumer gives up on (it does not parse, its payout id was used for
// another payout, or the broker will not deliver it again) is recorded in
// payout_dead_letters before it is terminated.
//
//	payouts consume   the consumer, with an embedded sweeper
//	payouts bank      the fake bank, which dedupes on its Idempotency-Key header
//	payouts dead-letters list|replay
//	                  the messages the consumer gave up on: list them, publish them again
//
// Run `payouts <command> -h` for a command's flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemflow/idemflow/examples/payouts/payout"
)

const usage = `usage: payouts <command> [flags]

commands:
  consume   consume payouts.requested, with an embedded sweeper
  bank      the fake bank
  dead-letters list|replay
            the messages the consumer gave up on
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "consume":
		err = consumeCmd(ctx, args)
	case "bank":
		err = bankCmd(ctx, args)
	case "dead-letters":
		err = deadLettersCmd(ctx, args, os.Stdout)
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "payouts: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "payouts %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// bankCmd runs the fake bank.
func bankCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bank", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8091", "address to listen on")
	failEvery := fs.Int("fail-every", 0, "answer every n-th transfer request 503 (0: never)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	hs := &http.Server{Handler: payout.NewBank(*failEvery).Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { <-ctx.Done(); _ = hs.Close() }()
	fmt.Printf("bank: listening on http://%s\n", ln.Addr())
	if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
