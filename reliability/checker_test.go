package reliability

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
)

// auditSQL creates, in schema, the audit table and the trigger that records every
// insert, update and delete of a key row with the old and new lock version, recovery
// point and status, so that the checker can tell whether any of them went backwards.
func auditSQL(schema string) string {
	s := pgx.Identifier{schema}.Sanitize()
	return fmt.Sprintf(`
CREATE TABLE %[1]s.rel_audit (
	seq        bigserial   PRIMARY KEY,
	op         text        NOT NULL,
	scope      text        NOT NULL,
	idem_key   text        NOT NULL,
	old_id     uuid,
	new_id     uuid,
	old_lv     bigint,
	new_lv     bigint,
	old_rp     text,
	new_rp     text,
	old_status text,
	new_status text,
	body_changed boolean   NOT NULL DEFAULT false,
	at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION %[1]s.rel_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		INSERT INTO %[1]s.rel_audit (op, scope, idem_key, new_id, new_lv, new_rp, new_status)
		VALUES ('I', NEW.scope, NEW.idempotency_key, NEW.id, NEW.lock_version, NEW.recovery_point, NEW.status);
	ELSIF TG_OP = 'UPDATE' THEN
		INSERT INTO %[1]s.rel_audit (op, scope, idem_key, old_id, new_id, old_lv, new_lv, old_rp, new_rp, old_status, new_status, body_changed)
		VALUES ('U', NEW.scope, NEW.idempotency_key, OLD.id, NEW.id, OLD.lock_version, NEW.lock_version,
			OLD.recovery_point, NEW.recovery_point, OLD.status, NEW.status,
			OLD.response_body IS DISTINCT FROM NEW.response_body OR OLD.response_status IS DISTINCT FROM NEW.response_status);
	ELSE
		INSERT INTO %[1]s.rel_audit (op, scope, idem_key, old_id, old_lv, old_rp, old_status)
		VALUES ('D', OLD.scope, OLD.idempotency_key, OLD.id, OLD.lock_version, OLD.recovery_point, OLD.status);
	END IF;
	RETURN NULL;
END
$$;
CREATE TRIGGER rel_audit AFTER INSERT OR UPDATE OR DELETE ON %[1]s.idemflow_keys
	FOR EACH ROW EXECUTE FUNCTION %[1]s.rel_audit_row();`, s)
}

// checkOpts tune the checker to an experiment.
type checkOpts struct {
	// keys are the (scope, key) pairs clients submitted: each must have a row.
	keys [][2]string
	// allowDead accepts dead-lettered keys (the experiment forced them).
	allowDead bool
	// redrove are keys an operator re-drove after they were dead-lettered: a client's
	// dead-letter answer (500) from before is accepted for them.
	redrove map[[2]string]bool
	// side tunes the side-effect check (envs made withSide).
	side sideOpts
	// retired checks the key rows the cleanup deleted too, as the env's rel_retired
	// table (retiredSQL) kept them: as finished keys, with their effects, payments
	// and answers.
	retired bool
}

// report is what the checker found.
type report struct {
	Keys, Finished, Dead, Unfinished           int
	EffectRows, DuplicateEffects               int
	Payments, DuplicatePayments, OrphanPayment int
	Answers, Retryable, BadAnswers             int
	AuditRows, AuditViolations                 int
	Retired                                    int // deleted by the cleanup (checkOpts.retired)
	DuplicateRows                              int // (scope, key) pairs with two rows or more
	Side                                       *sideReport
	History                                    *historyReport
	Violations                                 []string
}

func (r *report) violate(format string, args ...any) {
	if len(r.Violations) < 50 {
		r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
	} else if len(r.Violations) == 50 {
		r.Violations = append(r.Violations, "(more violations not listed)")
	}
}

// summary is the one line every experiment logs.
func (r *report) summary() string {
	return fmt.Sprintf("keys=%d finished=%d dead=%d unfinished=%d effect_rows=%d duplicate_effects=%d payments=%d duplicate_payments=%d orphan_payments=%d answers=%d retryable_answers=%d bad_answers=%d audit_rows=%d audit_violations=%d",
		r.Keys, r.Finished, r.Dead, r.Unfinished, r.EffectRows, r.DuplicateEffects, r.Payments, r.DuplicatePayments,
		r.OrphanPayment, r.Answers, r.Retryable, r.BadAnswers, r.AuditRows, r.AuditViolations)
}

type keyRow struct {
	scope, key, id, flow, status, rp string
	respStatus                       *int
	respBody                         []byte
}

// check quiesces nothing itself: the experiment must have stopped its load, its
// sweepers and its children. It reads the key table, the effect tables, the audit
// table, the provider's payments and the recorded answers, and fails t on any
// violation of the invariants. It logs and returns the report.
func (e *env) check(t testing.TB, o checkOpts) *report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := &report{}

	keys, byID := e.readKeyRows(ctx, t)
	e.checkDuplicateRows(ctx, t, r)
	if o.retired {
		e.addRetired(ctx, t, r, keys, byID)
	}
	checkKeyStatuses(r, keys, o)
	e.checkEffects(ctx, t, r, keys)
	e.checkPayments(r, keys, byID)
	e.checkAnswers(r, keys, o)
	e.checkAudit(ctx, t, r, keys)

	if e.side != nil {
		e.checkSide(ctx, t, r, keys, o.side)
	}
	e.checkHistory(t, r, keys)

	t.Logf("invariants: %s", r.summary())
	if len(r.Violations) > 0 {
		t.Errorf("invariant violations (%d):\n  %s", len(r.Violations), strings.Join(r.Violations, "\n  "))
	}
	return r
}

// readKeyRows reads every key row, by (scope, key) and by id. One row per (scope,
// key) is the primary key of the default layout (checkDuplicateRows looks anyway).
func (e *env) readKeyRows(ctx context.Context, t testing.TB) (keys map[[2]string]*keyRow, byID map[string]*keyRow) {
	t.Helper()
	rows, err := e.db.Pool.Query(ctx, `SELECT scope, idempotency_key, id::text, flow, status, recovery_point,
		response_status::int, response_body FROM idemflow_keys`)
	require.NoError(t, err)
	keys = map[[2]string]*keyRow{}
	byID = map[string]*keyRow{}
	for rows.Next() {
		k := &keyRow{}
		require.NoError(t, rows.Scan(&k.scope, &k.key, &k.id, &k.flow, &k.status, &k.rp, &k.respStatus, &k.respBody))
		keys[[2]string{k.scope, k.key}] = k
		byID[k.id] = k
	}
	require.NoError(t, rows.Err())
	return keys, byID
}

// checkKeyStatuses counts the key rows: every submitted key has one, and each is
// finished (or dead, when the experiment allows it).
func checkKeyStatuses(r *report, keys map[[2]string]*keyRow, o checkOpts) {
	r.Keys = len(keys)
	for _, sk := range o.keys {
		if keys[sk] == nil {
			r.Unfinished++
			r.violate("key %s/%s was submitted but has no row", sk[0], sk[1])
		}
	}
	for _, k := range keys {
		switch {
		case k.status == "finished":
			r.Finished++
		case k.status == "dead" && o.allowDead:
			r.Dead++
		case k.status == "dead":
			r.Dead++
			r.violate("key %s/%s was dead-lettered", k.scope, k.key)
		default:
			r.Unfinished++
			r.violate("key %s/%s is unfinished at %s (%s)", k.scope, k.key, k.rp, k.status)
		}
	}
}

// checkEffects: at most one effect row per key, exactly one per finished key, each
// of its key row's flow.
func (e *env) checkEffects(ctx context.Context, t testing.TB, r *report, keys map[[2]string]*keyRow) {
	t.Helper()
	effects := map[[2]string]int{}
	for flow, q := range effectCounts {
		rows, err := e.db.Pool.Query(ctx, q)
		require.NoError(t, err)
		for rows.Next() {
			var scope, key string
			var n int
			require.NoError(t, rows.Scan(&scope, &key, &n))
			r.EffectRows += n
			effects[[2]string{scope, key}] += n
			if n > 1 {
				r.DuplicateEffects += n - 1
				r.violate("key %s/%s has %d effect rows of flow %s", scope, key, n, flow)
			}
			if k := keys[[2]string{scope, key}]; k == nil || k.flow != flow {
				r.violate("effect row of flow %s for %s/%s, which has no key row of that flow", flow, scope, key)
			}
		}
		require.NoError(t, rows.Err())
	}
	for sk, k := range keys {
		if k.status == "finished" && effects[sk] != 1 {
			r.violate("finished key %s/%s has %d effect rows, want 1", sk[0], sk[1], effects[sk])
		}
	}
}

// checkPayments: the provider made payments only for existing key rows and their
// call phases, one per call phase of a key, and the ones the stored answer names.
func (e *env) checkPayments(r *report, keys map[[2]string]*keyRow, byID map[string]*keyRow) {
	payments, _, made, _ := e.provider.snapshot()
	r.Payments = made
	paid := map[string]map[string]string{} // key row id -> phase -> payment id
	for derived, p := range payments {
		id, phase, ok := strings.Cut(derived, ":")
		k := byID[id]
		if !ok || k == nil {
			r.OrphanPayment++
			r.violate("payment %s under derived key %q belongs to no key row", p.ID, derived)
			continue
		}
		if !slices.Contains(flowCalls[k.flow], phase) {
			r.violate("payment %s under derived key %q: %s has no call phase %q", p.ID, derived, k.flow, phase)
		}
		if paid[id] == nil {
			paid[id] = map[string]string{}
		}
		if prev, dup := paid[id][phase]; dup {
			r.DuplicatePayments++
			r.violate("key %s/%s paid twice in phase %s: %s and %s", k.scope, k.key, phase, prev, p.ID)
		}
		paid[id][phase] = p.ID
	}
	// Two rows (ids) for one (scope, key) cannot exist at once; a payment under an id
	// that is not the row's is an orphan, counted above.
	for _, k := range keys {
		if k.status != "finished" || k.respStatus == nil {
			continue
		}
		named, err := paymentsNamed(k.flow, *k.respStatus, k.respBody)
		if err != nil {
			r.violate("key %s/%s: stored answer unreadable: %v", k.scope, k.key, err)
			continue
		}
		for phase, pid := range named {
			if got := paid[k.id][phase]; got != pid {
				r.violate("key %s/%s: the answer names payment %q for %s, the provider made %q", k.scope, k.key, pid, phase, got)
			}
		}
		if *k.respStatus == 201 && len(paid[k.id]) != len(flowCalls[k.flow]) {
			r.violate("key %s/%s answered 201 with %d of %d calls paid", k.scope, k.key, len(paid[k.id]), len(flowCalls[k.flow]))
		}
	}
}

// checkAnswers: every answer a client got is retryable, or the stored answer byte
// for byte.
func (e *env) checkAnswers(r *report, keys map[[2]string]*keyRow, o checkOpts) {
	for sk, list := range e.answers.all() {
		k := keys[sk]
		for _, a := range list {
			r.Answers++
			if a.Retryable {
				r.Retryable++
				continue
			}
			switch {
			case a.Status == 500 && o.allowDead && k != nil && k.status == "dead":
			case a.Dead && o.redrove[sk]:
			case k == nil || k.status != "finished":
				r.BadAnswers++
				r.violate("key %s/%s: client got final answer %d (%s via %s) but the key is not finished", sk[0], sk[1], a.Status, a.Err, a.Via)
			case a.Status != *k.respStatus || !bytes.Equal(a.Body, k.respBody):
				r.BadAnswers++
				r.violate("key %s/%s: client got %d %q (%s via %s), stored is %d %q", sk[0], sk[1], a.Status, a.Body, a.Err, a.Via, *k.respStatus, k.respBody)
			}
		}
	}
}

// auditRow is one row of rel_audit (auditSQL).
type auditRow struct {
	seq, oldLV, newLV                                        int64
	op, scope, key, oldID, newID, oldRP, newRP, oldSt, newSt string
	bodyChanged                                              bool
}

// checkAudit: nothing went backwards, a finished row never changed, only finished
// rows were deleted, a row's identity never changed.
func (e *env) checkAudit(ctx context.Context, t testing.TB, r *report, keys map[[2]string]*keyRow) {
	t.Helper()
	flowOf := map[[2]string]string{}
	for sk, k := range keys {
		flowOf[sk] = k.flow
	}
	arows, err := e.db.Pool.Query(ctx, `SELECT seq, op, scope, idem_key, coalesce(old_id::text, ''), coalesce(new_id::text, ''),
		coalesce(old_lv, 0), coalesce(new_lv, 0), coalesce(old_rp, ''), coalesce(new_rp, ''),
		coalesce(old_status, ''), coalesce(new_status, ''), body_changed FROM rel_audit ORDER BY seq`)
	require.NoError(t, err)
	for arows.Next() {
		var a auditRow
		require.NoError(t, arows.Scan(&a.seq, &a.op, &a.scope, &a.key, &a.oldID, &a.newID, &a.oldLV, &a.newLV,
			&a.oldRP, &a.newRP, &a.oldSt, &a.newSt, &a.bodyChanged))
		r.AuditRows++
		checkAuditRow(r, a, flowOf[[2]string{a.scope, a.key}])
	}
	require.NoError(t, arows.Err())
}

// checkAuditRow checks one audited insert, update or delete of a key row of flow.
func checkAuditRow(r *report, a auditRow, flow string) {
	bad := func(format string, args ...any) {
		r.AuditViolations++
		r.violate("audit %d (%s %s/%s): %s", a.seq, a.op, a.scope, a.key, fmt.Sprintf(format, args...))
	}
	switch a.op {
	case "I":
		// A key row is inserted by the commit of its first transaction: at
		// started (a flow that calls first, or a phase at REPEATABLE READ or
		// above, whose claim inserts it), at the first phase, or finished by it.
		first := a.newRP == phases.Started || a.newRP == phases.Finished ||
			(len(flowPhases[flow]) > 0 && a.newRP == flowPhases[flow][0])
		if a.newLV != 1 || !first || (a.newRP == phases.Finished) != (a.newSt == "finished") || (a.newSt != "in_progress" && a.newSt != "finished") {
			bad("inserted at lock version %d, %s, %s", a.newLV, a.newRP, a.newSt)
		}
	case "D":
		if a.oldSt != "finished" {
			bad("an unfinished row (%s) was deleted", a.oldSt)
		}
	case "U":
		if a.oldID != a.newID {
			bad("id changed from %s to %s", a.oldID, a.newID)
		}
		if a.newLV < a.oldLV {
			bad("lock version went back from %d to %d", a.oldLV, a.newLV)
		}
		if flow != "" && rank(flow, a.newRP) < rank(flow, a.oldRP) {
			bad("recovery point went back from %s to %s", a.oldRP, a.newRP)
		}
		if a.oldSt == "finished" {
			bad("a finished row changed (to %s at %s, answer changed: %v)", a.newSt, a.newRP, a.bodyChanged)
		}
		if (a.newRP == phases.Finished) != (a.newSt == "finished") {
			bad("recovery point %s with status %s", a.newRP, a.newSt)
		}
	}
}

// checkDuplicateRows reports every (scope, key) with more than one key row. The
// default layout's primary key makes that impossible; a partitioned key table has no
// unique index on (scope, key) (its primary key includes created_at), and only the
// claim lock keeps one row per key there (docs/PARTITIONS.md), so the checker looks.
func (e *env) checkDuplicateRows(ctx context.Context, t testing.TB, r *report) {
	t.Helper()
	rows, err := e.db.Pool.Query(ctx, `SELECT scope, idempotency_key, count(*),
	string_agg(id::text || ' ' || tableoid::regclass::text || ' ' || status, ', ' ORDER BY created_at)
FROM idemflow_keys GROUP BY scope, idempotency_key HAVING count(*) > 1`)
	require.NoError(t, err)
	for rows.Next() {
		var scope, key, which string
		var n int
		require.NoError(t, rows.Scan(&scope, &key, &n, &which))
		r.DuplicateRows += n - 1
		r.violate("key %s/%s has %d rows: %s", scope, key, n, which)
	}
	require.NoError(t, rows.Err())
}

// addRetired adds the key rows the cleanup deleted (rel_retired) to keys and byID. A
// retired key with a row again was executed a second time after its retention: the
// experiments that retire keys never send a key again that late.
func (e *env) addRetired(ctx context.Context, t testing.TB, r *report, keys map[[2]string]*keyRow, byID map[string]*keyRow) {
	t.Helper()
	rows, err := e.db.Pool.Query(ctx, `SELECT scope, idem_key, id::text, flow, status, response_status, response_body FROM rel_retired`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		k := &keyRow{rp: phases.Finished}
		require.NoError(t, rows.Scan(&k.scope, &k.key, &k.id, &k.flow, &k.status, &k.respStatus, &k.respBody))
		r.Retired++
		sk := [2]string{k.scope, k.key}
		if prev := keys[sk]; prev != nil {
			r.violate("key %s/%s was deleted by the cleanup (id %s) and has a row again (id %s)", k.scope, k.key, k.id, prev.id)
			continue
		}
		keys[sk], byID[k.id] = k, k
	}
	require.NoError(t, rows.Err())
}

// rank orders a flow's recovery points: started, its phases, finished.
func rank(flow, rp string) int {
	switch rp {
	case phases.Started:
		return 0
	case phases.Finished:
		return 1000
	}
	if i := slices.Index(flowPhases[flow], rp); i >= 0 {
		return i + 1
	}
	return -1
}
