package idemmsg_test

import (
	"context"

	"github.com/idemflow/idemflow/idemmsg"
	"github.com/idemflow/idemflow/workflow"
)

// delivery stands for a broker's message.
type delivery struct {
	ID   string
	Data []byte
}

// usage holds the package documentation's snippet, compiled (TestDocSnippets in the
// module's root checks that doc.go shows these lines).
func usage(ctx context.Context, engine *workflow.Engine, msg delivery) idemmsg.Decision {
	d := idemmsg.Handle(ctx, engine, idemmsg.Message{
		Scope: "payouts", Key: msg.ID, Flow: "payout", Payload: msg.Data,
	})
	switch d.Action {
	case idemmsg.Ack: // finished (d.Result.Replayed for a replay): ack
	case idemmsg.Retry: // in progress or transient: redeliver after d.Delay
	case idemmsg.Terminate: // mismatch, invalid or dead-lettered: never redeliver
	}
	return d
}

var _ = usage
