package keytable

import (
	"encoding/binary"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// rowTypes is the type of each column of rowColumns (and leasedColumns), in order, as
// decodeRow reads them: text and jsonb in either format, the others in binary (as
// pgx's extended protocol asks for them).
var rowTypes = [...]uint32{
	pgtype.TextOID, pgtype.TextOID, pgtype.TextOID, // scope, idempotency_key, id
	pgtype.TextOID, pgtype.TextOID, pgtype.TextOID, // flow, method, route
	pgtype.ByteaOID, pgtype.ByteaOID, // fingerprint, request_body
	pgtype.TextOID, pgtype.JSONBOID, pgtype.TextOID, // recovery_point, phase_data, status
	pgtype.Int8OID, pgtype.Int4OID, pgtype.TextOID, // lock_version, attempts, last_error
	pgtype.TextOID, pgtype.TimestamptzOID, // origin, created_at
	pgtype.BoolOID, pgtype.Int8OID, // lease_live, lease_left_ms
	pgtype.Int4OID, pgtype.JSONBOID, pgtype.ByteaOID, // response_status, response_headers, response_body
}

// rowBox is a Row with room for what its pointer fields point to, so that a decoded
// row is one allocation.
type rowBox struct {
	Row
	status    int
	lastError string
}

// decodeRow reads the current row of rows, the columns of rowColumns, from their raw
// values, in three allocations: the row, its text columns (one string) and its
// bytea and jsonb columns (one buffer, each column's slice capped at its end). It
// gives the same Row as rows.Scan into Row's fields. It reports false, having read
// nothing, when the columns are not exactly these types in these formats (a simple
// protocol exec mode reads all in text), when the connection scans timestamps into a
// location of its own (pgtype.TimestamptzCodec.ScanLocation), or when a value is one
// rows.Scan refuses (NULL in a NOT NULL column, an infinite time, a jsonb version
// other than 1): the caller scans then, and gets the same row or error as before.
func decodeRow(rows pgx.Rows) (*Row, bool) {
	fds := rows.FieldDescriptions()
	raw := rows.RawValues()
	if len(fds) != len(rowTypes) || len(raw) != len(rowTypes) || !defaultTimes(rows.Conn()) {
		return nil, false
	}
	d := rowDecoder{ok: true}
	copy(d.raw[:], raw) // pgx's own slice is left as it is, for rows.Scan
	var texts, bytes int
	for i, fd := range fds {
		if fd.DataTypeOID != rowTypes[i] {
			return nil, false
		}
		v := d.raw[i]
		switch rowTypes[i] {
		case pgtype.TextOID: // the same bytes in either format
			d.off[i] = texts
			texts += len(v)
			continue
		case pgtype.JSONBOID: // text, or binary: the version byte 1 and the text
			if fd.Format == pgx.BinaryFormatCode && v != nil {
				if len(v) == 0 || v[0] != 1 {
					return nil, false
				}
				d.raw[i] = v[1:]
			}
			d.off[i] = bytes
			bytes += len(d.raw[i])
			continue
		}
		if fd.Format != pgx.BinaryFormatCode {
			return nil, false
		}
		if rowTypes[i] == pgtype.ByteaOID {
			d.off[i] = bytes
			bytes += len(v)
		}
	}
	var sb strings.Builder
	sb.Grow(texts)
	d.buf = make([]byte, 0, bytes)
	for i, v := range d.raw {
		switch rowTypes[i] {
		case pgtype.TextOID:
			sb.Write(v)
		case pgtype.JSONBOID, pgtype.ByteaOID:
			d.buf = append(d.buf, v...)
		}
	}
	d.text = sb.String()
	b := &rowBox{}
	r := &b.Row
	r.Scope, r.Key, r.ID, r.Flow, r.Method, r.Route = d.str(0), d.str(1), d.str(2), d.str(3), d.str(4), d.str(5)
	r.Fingerprint, r.RequestBody = d.bytes(6), d.bytes(7)
	r.RecoveryPoint, r.PhaseData, r.Status = d.str(8), d.bytes(9), d.str(10)
	r.LockVersion, r.Attempts = d.int8(11), int(d.int4(12))
	if d.raw[13] != nil {
		b.lastError = d.str(13)
		r.LastError = &b.lastError
	}
	r.Origin, r.CreatedAt = d.str(14), d.time(15)
	r.LeaseLive, r.LeaseLeftMillis = d.bool(16), d.int8(17)
	if d.raw[18] != nil {
		b.status = int(d.int4(18))
		r.ResponseStatus = &b.status
	}
	r.ResponseHeaders, r.ResponseBody = d.bytes(19), d.bytes(20)
	return r, d.ok
}

// defaultTimes reports whether c scans timestamptz values as pgx does by default.
func defaultTimes(c *pgx.Conn) bool {
	if c == nil {
		return false
	}
	t, ok := c.TypeMap().TypeForOID(pgtype.TimestamptzOID)
	if !ok {
		return false
	}
	codec, ok := t.Codec.(*pgtype.TimestamptzCodec)
	return ok && codec.ScanLocation == nil
}

// rowDecoder reads the columns of one row: raw's values (a jsonb column's without
// its version byte), the text columns from text and the bytea and jsonb ones from buf,
// each at off. ok turns false at a value it cannot read.
type rowDecoder struct {
	raw  [len(rowTypes)][]byte
	off  [len(rowTypes)]int
	text string
	buf  []byte
	ok   bool
}

// str is the text column i; NULL is not read.
func (d *rowDecoder) str(i int) string {
	if d.raw[i] == nil {
		d.ok = false
		return ""
	}
	return d.text[d.off[i] : d.off[i]+len(d.raw[i])]
}

// bytes is the bytea or jsonb column i (jsonb's text): nil for NULL.
func (d *rowDecoder) bytes(i int) []byte {
	if d.raw[i] == nil {
		return nil
	}
	end := d.off[i] + len(d.raw[i])
	return d.buf[d.off[i]:end:end]
}

// fixed is the value of the fixed-size column i of n bytes.
func (d *rowDecoder) fixed(i, n int) []byte {
	if len(d.raw[i]) != n { // NULL, or not this type
		d.ok = false
		return make([]byte, n)
	}
	return d.raw[i]
}

func (d *rowDecoder) int8(i int) int64 { return int64(binary.BigEndian.Uint64(d.fixed(i, 8))) }
func (d *rowDecoder) int4(i int) int32 { return int32(binary.BigEndian.Uint32(d.fixed(i, 4))) }
func (d *rowDecoder) bool(i int) bool  { return d.fixed(i, 1)[0] == 1 }

// y2k is 2000-01-01 in microseconds since the Unix epoch: PostgreSQL's epoch.
const y2k = 946_684_800 * 1_000_000

// time is the timestamptz column i, as pgx scans it: time.Unix, in time.Local.
func (d *rowDecoder) time(i int) time.Time {
	us := d.int8(i)
	if us == math.MaxInt64 || us == math.MinInt64 { // infinity: rows.Scan refuses it
		d.ok = false
		return time.Time{}
	}
	return time.Unix(y2k/1_000_000+us/1_000_000, (y2k%1_000_000*1_000)+(us%1_000_000*1_000))
}
