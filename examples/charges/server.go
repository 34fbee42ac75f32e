package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/workflow"
)

// serve runs the HTTP API with an embedded sweeper.
func serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on")
	withSweeper := fs.Bool("sweeper", true, "run the sweeper in this process")
	grace := fs.Duration("shutdown-timeout", 10*time.Second, "on SIGTERM, how long running attempts may finish before their keys are released for another server")
	wait := fs.Duration("wait", 0, "how long a request whose key another attempt holds waits for its answer before 409 (idemhttp.Config.Wait; 0: 409 at once)")
	shedHold := fs.Duration("shed-hold", 500*time.Millisecond, "how long the 503 to a request turned away under overload is held before it is sent, so that clients that retry at once are paced (idemhttp.Config.ShedHold; 0: at once)")
	bare := fs.Bool("bare-control", false, "also serve POST /v1/bare: one plain INSERT, no idempotency (a load test's control)")
	var c common
	c.register(fs)
	fs.IntVar(&c.maxInFlight, "max-in-flight", 0, "attempts in flight at most, the rest answered 503 under overload (workflow.Config.MaxInFlight; 0: the default, -1: no cap)")
	fs.DurationVar(&c.admitWait, "admit-wait", 0, "how long an attempt waits at most before its claim for a place and a connection (workflow.Config.AdmitWait; 0: the default, -1: no bound)")
	tf := registerTelemetry(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	tel, err := tf.start()
	if err != nil {
		return err
	}
	defer tel.close() //nolint:errcheck // best effort at exit
	c.hooks = tel.hooks()
	if *withSweeper {
		c.sweeperHooks = tel.sweeperHooks()
	}
	log := logger(os.Stderr)
	e, err := setup(ctx, &c, log)
	if err != nil {
		return err
	}
	defer e.close()
	if err := tel.observe(e.engine); err != nil {
		return err
	}

	api, err := newAPI(e, idemhttp.Config{Wait: *wait, ShedHold: *shedHold})
	if err != nil {
		return err
	}
	if *bare {
		if api, err = withBareControl(ctx, e, api); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	hs := newHTTPServer(tel.handler(api))
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()

	if *withSweeper {
		if err := e.engine.Start(ctx, sweeperConfig(e, &c)); err != nil {
			return err
		}
		defer func() { // on an early return; Stop after shutdown does nothing
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = e.engine.Stop(sctx)
		}()
	}
	fmt.Printf("charges: listening on http://%s\n", ln.Addr())

	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	return shutdown(e, hs, *grace)
}

// shutdown stops the engine's sweeper, then drains the engine while the HTTP server
// shuts down: a request on a connection still open is answered 503 with Retry-After,
// running attempts may finish within grace and start no call phase, and at the end of
// grace the keys still held are released (fenced) so that a retry on another server
// resumes them at once instead of waiting for their leases.
func shutdown(e *env, hs *http.Server, grace time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	_ = e.engine.Stop(ctx) // if it runs; its attempts are drained below like the others
	drained := make(chan error, 1)
	go func() { drained <- e.engine.Drain(ctx) }()
	err := hs.Shutdown(ctx)
	if derr := <-drained; derr != nil {
		e.log.Warn("charges: drain", "err", derr)
	} else {
		e.log.Info("charges: drained")
	}
	if errors.Is(err, context.DeadlineExceeded) {
		err = hs.Close() // the drain released the keys of the requests still open
	}
	return err
}

// worker runs the sweeper and the River client that mails receipts.
func worker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	var c common
	c.register(fs)
	mailURL := fs.String("mail-url", "", "mail service base URL for receipts (default: start a fake one in-process)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := logger(os.Stderr)
	e, err := setup(ctx, &c, log)
	if err != nil {
		return err
	}
	defer e.close()
	if err := e.engine.Start(ctx, sweeperConfig(e, &c)); err != nil { // before the mailer: a bad flag fails first
		return err
	}
	defer func() { // on an early return; Stop after the one below does nothing
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.engine.Stop(sctx)
	}()
	if *mailURL == "" {
		url, stop, err := startMailbox()
		if err != nil {
			return err
		}
		defer stop()
		*mailURL = url
		fmt.Printf("mail: in-process at %s\n", url)
	}
	mailer, err := newRiver(e.pool, *mailURL, log)
	if err != nil {
		return err
	}
	if err := mailer.Start(ctx); err != nil {
		return fmt.Errorf("start river: %w", err)
	}
	fmt.Println("worker: sweeping")
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return errors.Join(e.engine.Stop(sctx), mailer.Stop(sctx))
}

// runProvider runs the fake payment provider.
func runProvider(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("provider", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8090", "address to listen on")
	latency := fs.Duration("latency", 0, "added to every payment request")
	failRate := fs.Float64("fail-rate", 0, "share of payment requests answered 503 before doing anything (0..1)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *failRate < 0 || *failRate > 1 {
		return fmt.Errorf("-fail-rate %v is outside 0..1", *failRate)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	hs := &http.Server{Handler: chargeflow.NewProvider(*latency, *failRate).Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	fmt.Printf("provider: listening on http://%s\n", ln.Addr())
	select {
	case <-ctx.Done():
		return hs.Close()
	case err := <-errc:
		return err
	}
}

// newAPI is the charges HTTP API; opts gives idemhttp.Config's Wait and ShedHold.
func newAPI(e *env, opts idemhttp.Config) (http.Handler, error) {
	create, err := idemhttp.Handler(e.engine, chargeflow.FlowName, &idemhttp.Config{
		Scope:    bearerAccount,
		Logger:   e.log,
		Wait:     opts.Wait,
		ShedHold: opts.ShedHold,
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", create)
	mux.HandleFunc("GET /v1/charges/{id}", func(w http.ResponseWriter, r *http.Request) {
		account, ok := readAccount(w, r)
		if !ok {
			return
		}
		id := r.PathValue("id")
		if !validID(id) { // no charge has it, and Postgres would refuse it as text
			writeProblem(w, http.StatusNotFound, "not found", "no such charge")
			return
		}
		c, err := chargeflow.ScanCharge(e.pool.QueryRow(r.Context(), `
			SELECT id, amount, currency, source, status, provider_payment_id
			FROM charges WHERE id = $1 AND account_id = $2`, id, account))
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			writeProblem(w, http.StatusNotFound, "not found", "no such charge")
		case err != nil:
			e.readFailed(w, r, "get charge", err)
		default:
			writeJSON(w, http.StatusOK, c)
		}
	})
	mux.HandleFunc("GET /v1/charges", func(w http.ResponseWriter, r *http.Request) {
		account, ok := readAccount(w, r)
		if !ok {
			return
		}
		rows, err := e.pool.Query(r.Context(), `
			SELECT id, amount, currency, source, status, provider_payment_id
			FROM charges WHERE account_id = $1 ORDER BY created_at, id LIMIT 100`, account)
		if err != nil {
			e.readFailed(w, r, "list charges", err)
			return
		}
		list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (chargeflow.Charge, error) { return chargeflow.ScanCharge(row) })
		if err != nil {
			e.readFailed(w, r, "list charges", err)
			return
		}
		if list == nil {
			list = []chargeflow.Charge{}
		}
		writeJSON(w, http.StatusOK, map[string]any{"data": list})
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := e.pool.Ping(r.Context()); err != nil {
			writeProblem(w, http.StatusServiceUnavailable, "database unavailable", "")
			return
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux, nil
}

// bearerAccount resolves the account from "Authorization: Bearer <account_id>". A
// real service would verify a token here.
func bearerAccount(r *http.Request) (string, error) {
	h := r.Header.Get("Authorization")
	account, ok := strings.CutPrefix(h, "Bearer ")
	account = strings.TrimSpace(account)
	if !ok || account == "" || len(account) > 255 {
		return "", errors.New("send Authorization: Bearer <account_id>")
	}
	return account, nil
}

// readAccount resolves the account of a read, as the idempotent routes do: a Bearer
// account that workflow.ValidateScope accepts (UTF-8 text without control characters),
// the same rule under which charges are created. Otherwise it answers 401 and reports
// false.
func readAccount(w http.ResponseWriter, r *http.Request) (string, bool) {
	account, err := bearerAccount(r)
	if err == nil && workflow.ValidateScope(account) != nil {
		err = errors.New("the account must be 1-255 bytes of UTF-8 text without control characters")
	}
	if err != nil {
		writeProblem(w, http.StatusUnauthorized, "unauthorized", err.Error())
		return "", false
	}
	return account, true
}

// validID reports whether id can name a charge: text Postgres stores (UTF-8 without
// NUL), at most 255 bytes. Any other id is simply not found.
func validID(id string) bool {
	return id != "" && len(id) <= 255 && utf8.ValidString(id) && !strings.ContainsRune(id, 0)
}

// readFailed answers 500 to a read the database failed, and logs it, unless the client
// went away (then there is no one to answer and nothing to alarm anyone about).
func (e *env) readFailed(w http.ResponseWriter, r *http.Request, what string, err error) {
	if r.Context().Err() != nil {
		return
	}
	e.log.ErrorContext(r.Context(), "charges: "+what, "err", err)
	writeProblem(w, http.StatusInternalServerError, "internal error", "")
}

func writeProblem(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": title, "status": status, "detail": detail})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// newHTTPServer is the API's server, with read-header, read and idle timeouts: a
// client that sends its headers or body too slowly, or keeps an idle connection open,
// does not hold a connection of the server for ever. There is no write timeout: an
// answer may wait for phases as long as the lease.
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
}
