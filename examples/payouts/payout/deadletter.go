package payout

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/phases"
)

// DeadLetter is a message the consumer gave up on, kept in payout_dead_letters.
type DeadLetter struct {
	ID         int64
	Stream     string
	StreamSeq  uint64
	Subject    string
	MsgID      []byte // the Nats-Msg-Id header, as sent
	Data       []byte // the body, as sent
	Reason     string
	Delivered  uint64
	CreatedAt  time.Time
	Replays    int
	ReplayedAt *time.Time
}

// The dead-letter statements, in one place.
const (
	sqlRecordDeadLetter = `
		INSERT INTO payout_dead_letters (stream, stream_seq, subject, msg_id, data, reason, delivered)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (stream, stream_seq) DO UPDATE SET reason = EXCLUDED.reason, delivered = EXCLUDED.delivered`
	sqlListDeadLetters = `
		SELECT id, stream, stream_seq, subject, msg_id, data, reason, delivered, created_at, replays, replayed_at
		FROM payout_dead_letters WHERE id > $1 ORDER BY id LIMIT $2`
	sqlGetDeadLetter = `
		SELECT id, stream, stream_seq, subject, msg_id, data, reason, delivered, created_at, replays, replayed_at
		FROM payout_dead_letters WHERE id = $1`
	sqlMarkReplayed = `UPDATE payout_dead_letters SET replays = $2, replayed_at = now() WHERE id = $1 AND replays = $2 - 1`
)

// RecordDeadLetter stores d (its ID, CreatedAt and replay fields are ignored). A
// message recorded again (a redelivery after a crash between the record and the
// termination) keeps one row, with the latest reason. The reason is stored as valid
// UTF-8 without NUL.
func RecordDeadLetter(ctx context.Context, db phases.DBTX, d DeadLetter) error {
	reason := strings.ReplaceAll(strings.ToValidUTF8(d.Reason, "\uFFFD"), "\x00", "\uFFFD")
	subject := strings.ReplaceAll(strings.ToValidUTF8(d.Subject, "\uFFFD"), "\x00", "\uFFFD")
	msgID := d.MsgID
	if msgID == nil {
		msgID = []byte{}
	}
	_, err := db.Exec(ctx, sqlRecordDeadLetter, d.Stream, int64(d.StreamSeq), subject, msgID, d.Data, reason, int64(d.Delivered))
	if err != nil {
		return fmt.Errorf("record dead letter: %w", err)
	}
	return nil
}

// ListDeadLetters returns up to limit dead letters with an id above after, oldest
// first.
func ListDeadLetters(ctx context.Context, db phases.DBTX, after int64, limit int) ([]DeadLetter, error) {
	rows, err := db.Query(ctx, sqlListDeadLetters, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	list, err := pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return list, nil
}

// GetDeadLetter returns the dead letter id; pgx.ErrNoRows when there is none.
func GetDeadLetter(ctx context.Context, db phases.DBTX, id int64) (DeadLetter, error) {
	rows, err := db.Query(ctx, sqlGetDeadLetter, id)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("get dead letter: %w", err)
	}
	d, err := pgx.CollectExactlyOneRow(rows, scanDeadLetter)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("get dead letter %d: %w", id, err)
	}
	return d, nil
}

// MarkReplayed records that dead letter id was published again as its replay number
// n (1 for the first). It reports false if another replay got there first.
func MarkReplayed(ctx context.Context, db phases.DBTX, id int64, n int) (bool, error) {
	tag, err := db.Exec(ctx, sqlMarkReplayed, id, n)
	if err != nil {
		return false, fmt.Errorf("mark dead letter %d replayed: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// ReplayMsgID is the Nats-Msg-Id of replay n of dead letter id: the same for the same
// replay, so that a replay published twice (a crash before MarkReplayed) is dropped by
// the stream's duplicate window, and new for the next replay.
func ReplayMsgID(id int64, n int) string { return fmt.Sprintf("dead-letter-%d-replay-%d", id, n) }

func scanDeadLetter(row pgx.CollectableRow) (DeadLetter, error) {
	var d DeadLetter
	var seq, delivered int64
	err := row.Scan(&d.ID, &d.Stream, &seq, &d.Subject, &d.MsgID, &d.Data, &d.Reason, &delivered, &d.CreatedAt, &d.Replays, &d.ReplayedAt)
	d.StreamSeq, d.Delivered = uint64(seq), uint64(delivered)
	return d, err
}
