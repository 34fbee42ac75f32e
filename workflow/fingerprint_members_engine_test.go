package workflow_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// membersEngine returns an engine on b's schema whose test flow fingerprints only the
// members listed (none: the whole body, as without the option).
func membersEngine(t *testing.T, b *bundle, before func(context.Context, phases.DBTX, *phases.Run) error, members ...string) *workflow.Engine {
	t.Helper()
	e, err := workflow.New(b.db.Pool, nil)
	require.NoError(t, err)
	f := testflow.Flow(testflow.Options{ProviderURL: b.provider.URL, Before: before})
	f.FingerprintMembers = members
	require.NoError(t, e.Register(f))
	return e
}

// storedFingerprint reads the fingerprint stored on a key.
func storedFingerprint(t *testing.T, b *bundle, scope, key string) []byte {
	t.Helper()
	var fp []byte
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT fingerprint FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2`, scope, key).Scan(&fp))
	return fp
}

// TestMembersReplayAndMismatch runs a flow that fingerprints /amount and /currency: a
// retry that differs only elsewhere (a timestamp, a trace id) or only in spelling is
// replayed the first answer; one whose chosen member differs, is missing or is null is
// a mismatch that writes nothing. One effect in all.
func TestMembersReplayAndMismatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	e := membersEngine(t, b, nil, "/currency", "/amount")
	first, err := e.Do(ctx, chargeReq("acct", "k", `{"amount":100,"currency":"usd","sent_at":"2026-12-01T18:00:00Z"}`))
	require.NoError(t, err)
	require.Equal(t, 201, first.Response.Status)
	fp := storedFingerprint(t, b, "acct", "k")
	require.Len(t, fp, 73, "a version 3 fingerprint")
	require.Equal(t, byte(0x03), fp[0])
	before := keyRow(t, b.db, "acct", "k")

	for _, body := range []string{
		`{"amount":100,"currency":"usd","sent_at":"2026-12-01T18:00:07Z"}`,
		`{"trace":"4bf92f35","currency":"\u0075sd","amount":1.00e2}`,
		`{"amount":100,"currency":"usd"}`,
	} {
		again, err := e.Do(ctx, chargeReq("acct", "k", body))
		require.NoError(t, err, body)
		require.True(t, again.Replayed, body)
		require.Equal(t, first.Response.Body, again.Response.Body, body)
	}
	for _, body := range []string{
		`{"amount":101,"currency":"usd","sent_at":"2026-12-01T18:00:00Z"}`,
		`{"amount":100,"currency":"eur","sent_at":"2026-12-01T18:00:00Z"}`,
		`{"amount":100,"sent_at":"2026-12-01T18:00:00Z"}`,
		`{"amount":100,"currency":null,"sent_at":"2026-12-01T18:00:00Z"}`,
	} {
		_, err := e.Do(ctx, chargeReq("acct", "k", body))
		require.ErrorIs(t, err, workflow.ErrMismatch, body)
	}
	require.Equal(t, before, keyRow(t, b.db, "acct", "k"), "replays and mismatches write nothing")
	requireOneEffect(t, b, "acct", "k")
	require.Equal(t, 1, b.provider.Made())
}

// TestMembersNotJSON sends bodies that are not one JSON value to a flow that
// fingerprints chosen members: refused as bad input (ErrBodyNotJSON; HTTP 400 with a
// problem body saying so), nothing written, for a new key and for a retry of a key.
func TestMembersNotJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	e := membersEngine(t, b, nil, "/amount")
	for _, body := range []string{`amount=100`, `{"amount":100,"amount":100}`, ``} {
		_, err := e.Do(ctx, chargeReq("acct", "new", body))
		require.ErrorIs(t, err, workflow.ErrBodyNotJSON, "%q", body)
		require.NotErrorIs(t, err, workflow.ErrMismatch)
	}
	require.Equal(t, 0, countKeys(t, b.db), "nothing written")

	h, err := idemhttp.Handler(e, testflow.Name, &idemhttp.Config{
		Scope: func(*http.Request) (string, error) { return "acct", nil }})
	require.NoError(t, err)
	post := func(key, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(body))
		r.Header.Set(idemhttp.KeyHeader, key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	w := post("new", `amount=100`)
	require.Equal(t, http.StatusBadRequest, w.Code, w.Body.String())
	require.Contains(t, w.Body.String(), "must be one JSON value")
	require.Equal(t, 0, countKeys(t, b.db), "nothing written")

	require.Equal(t, http.StatusCreated, post("k", `{"amount":5,"at":1}`).Code)
	before := keyRow(t, b.db, "acct", "k")
	require.Equal(t, http.StatusBadRequest, post("k", `amount=5`).Code, "a retry that is not JSON")
	w = post("k", `{"amount":5,"at":2}`)
	require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
	require.Equal(t, "true", w.Header().Get(idemhttp.ReplayedHeader))
	require.Equal(t, http.StatusUnprocessableEntity, post("k", `{"amount":6,"at":1}`).Code)
	require.Equal(t, before, keyRow(t, b.db, "acct", "k"))
}

// TestMembersRowsAcrossRules meets keys written under one fingerprint rule with an
// engine whose flow has another (the option turned on or off, or the list changed, as
// in a fleet mid-deploy): such a key is compared by the whole request, as without the
// option, so an identical retry (however respelled) replays, never a 422 or
// ErrNewerFormat, and any other is a mismatch that writes nothing. Under its own rule
// the key still replays a retry that differs in an unchosen member.
func TestMembersRowsAcrossRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	both := membersEngine(t, b, nil, "/amount", "/currency")
	amountOnly := membersEngine(t, b, nil, "/amount")
	whole := b.engine // this build, the flow without the option: version 2

	const body = `{"amount":100,"currency":"usd","sent_at":"t1"}`
	const respelled = `{"sent_at":"t1","currency":"\u0075sd","amount":1e2}`
	const otherTime = `{"amount":100,"currency":"usd","sent_at":"t2"}`
	check := func(e *workflow.Engine, key, retry string, replay bool) {
		t.Helper()
		before := keyRow(t, b.db, "acct", key)
		res, err := e.Do(ctx, chargeReq("acct", key, retry))
		if replay {
			require.NoError(t, err, "%s: %s", key, retry)
			require.True(t, res.Replayed)
		} else {
			require.ErrorIs(t, err, workflow.ErrMismatch, "%s: %s", key, retry)
		}
		require.Equal(t, before, keyRow(t, b.db, "acct", key))
	}
	for key, e := range map[string]*workflow.Engine{"v3": both, "v2": whole, "v3-amount": amountOnly} {
		_, err := e.Do(ctx, chargeReq("acct", key, body))
		require.NoError(t, err)
	}
	require.Len(t, storedFingerprint(t, b, "acct", "v2"), 33)

	for _, c := range []struct {
		e   *workflow.Engine
		key string
	}{
		{whole, "v3"},             // a version 3 row, met without the option
		{amountOnly, "v3"},        // met with a shorter list
		{both, "v3-amount"},       // met with a longer list
		{both, "v2"},              // a version 2 row, met once the option is on
		{amountOnly, "v3-amount"}, // the control: the same list
	} {
		check(c.e, c.key, body, true)
		check(c.e, c.key, respelled, true)
		check(c.e, c.key, `{"amount":101,"currency":"usd","sent_at":"t1"}`, false)
		check(c.e, c.key, otherTime, c.e == amountOnly && c.key == "v3-amount")
	}
	check(amountOnly, "v3-amount", `{"amount":100,"currency":"eur","sent_at":"t2"}`, true)
	for _, key := range []string{"v3", "v2", "v3-amount"} {
		requireOneEffect(t, b, "acct", key)
	}
	require.Equal(t, 3, b.provider.Made())
}

// TestMembersInProgressResumed releases a key with a version 3 fingerprint in progress
// (its provider call failed) and checks that a sweep of this build takes it, by an
// engine whose flow has no member list (the sweeper's SQL reads version 3 as known),
// and that a retry with another timestamp then replays its answer. One effect.
func TestMembersInProgressResumed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	fail := true
	e := membersEngine(t, b, func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if fail && run.Phase() == testflow.Pay {
			return errors.New("provider down")
		}
		return nil
	}, "/amount")
	_, err := e.Do(ctx, chargeReq("acct", "k", `{"amount":100,"sent_at":"t1"}`))
	var te *workflow.TransientError
	require.ErrorAs(t, err, &te)
	require.Equal(t, testflow.Reserve, state(t, b.db, "acct", "k").RecoveryPoint)
	require.Len(t, storedFingerprint(t, b, "acct", "k"), 73)
	fail = false

	testflow.Sweepable(t, b.db.Pool)
	plain := b.engine // the flow without a member list
	st, err := plain.Sweep(ctx, &workflow.SweeperConfig{MaxAttempts: 1, Grace: -1})
	require.NoError(t, err)
	require.Equal(t, 1, st.Finished, "the sweep finished the key")
	res, err := e.Do(ctx, chargeReq("acct", "k", `{"sent_at":"t2","amount":100}`))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, 201, res.Response.Status)
	requireOneEffect(t, b, "acct", "k")
}

// TestRegisterRefusesInvalidMembers registers flows with invalid member lists: each is
// refused with an error naming the pointer and what is wrong (phases.ErrInvalidFlow),
// and the flow is not registered. A valid list is kept as a copy.
func TestRegisterRefusesInvalidMembers(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for name, c := range map[string]struct {
		list []string
		want string
	}{
		"no slash":   {[]string{"/currency", "amount"}, `pointer "amount": not a JSON pointer`},
		"bare tilde": {[]string{"/a~"}, `pointer "/a~": "~" must be followed by "0"`},
		"tilde 2":    {[]string{"/a~2"}, `pointer "/a~2": "~" must be followed by "0"`},
		"twice":      {[]string{"/amount", "/amount"}, `pointer "/amount" is listed twice`},
		"too many":   {make([]string, 65), `65 pointers, at most 64`},
	} {
		e, err := workflow.New(b.db.Pool, nil)
		require.NoError(t, err)
		f := testflow.Flow(testflow.Options{ProviderURL: b.provider.URL})
		f.FingerprintMembers = c.list
		err = e.Register(f)
		require.ErrorIs(t, err, phases.ErrInvalidFlow, name)
		require.ErrorContains(t, err, c.want, name)
		_, ok := e.Flow(testflow.Name)
		require.False(t, ok, "%s: registered anyway", name)
	}
	e, err := workflow.New(b.db.Pool, nil)
	require.NoError(t, err)
	f := testflow.Flow(testflow.Options{ProviderURL: b.provider.URL})
	list := []string{"/amount", "/items/0/sku", "/a~1b", "/m~0n", ""}
	f.FingerprintMembers = list
	require.NoError(t, e.Register(f))
	list[0] = "/changed"
	got, ok := e.Flow(testflow.Name)
	require.True(t, ok)
	require.Equal(t, []string{"/amount", "/items/0/sku", "/a~1b", "/m~0n", ""}, got.FingerprintMembers)
}
