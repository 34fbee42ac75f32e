package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemflow/idemflow/migrations"
)

// EnvCitus names the environment variable that, when set (to anything but "" or "0"),
// makes the shared server a throwaway Citus cluster (StartCitus) and New distributes
// each test schema's key table by scope after migrating it. With TEST_DATABASE_URL it
// is taken to name a Citus coordinator that is already set up.
const EnvCitus = "IDEMFLOW_TEST_CITUS"

// citusWorkers is how many workers StartCitus adds to its coordinator.
const citusWorkers = 2

// citusSettings are the settings of every node of a throwaway cluster: Citus loaded,
// and few shards a table, so that each test's create_distributed_table is quick (4
// shards still spread over both workers), over plain connections between the nodes.
var citusSettings = []string{"shared_preload_libraries=citus", "citus.shard_count=4", "max_connections=500",
	"citus.node_conninfo=sslmode=disable"} // the nodes talk over loopback; no certificates to look for

// ErrNoCitus is returned by StartCitus when the PostgreSQL installation has no Citus
// extension.
var ErrNoCitus = errors.New("pgtest: Citus is not installed")

// Citus is a throwaway Citus cluster: a coordinator and its workers, each a server of
// its own on 127.0.0.1.
type Citus struct {
	// Coordinator is the node applications connect to. Its URL's database has the
	// citus extension, the workers added, and the coordinator's own address set.
	Coordinator *Server
	// Workers hold the shards.
	Workers []*Server
}

// CitusMode reports whether EnvCitus asks for Citus.
func CitusMode() bool { v := os.Getenv(EnvCitus); return v != "" && v != "0" }

// SkipUnlessCitus skips a test that only means something on a Citus cluster when the
// run is not in Citus mode, saying how to run it.
func SkipUnlessCitus(t testing.TB) {
	t.Helper()
	if !CitusMode() {
		t.Skip("skipped: needs a Citus cluster (set " + EnvCitus + "=1 where Citus is installed)")
	}
}

// StartCitus starts a coordinator and two workers from the local PostgreSQL server
// binaries and the installed Citus extension (citus.so in the server's library
// directory, `pg_config --pkglibdir`), and joins them into a cluster. It fails with an
// error wrapping ErrNoCitus when Citus is not installed, and ErrNoServer when there are
// no server binaries. Call Stop when done.
func StartCitus(ctx context.Context) (*Citus, error) {
	binDir, looked := findBinDir()
	if binDir == "" {
		return nil, fmt.Errorf("%w: no PostgreSQL server binaries (looked in %s)", ErrNoServer, looked)
	}
	if lib := citusLibrary(ctx, binDir); lib == "" {
		return nil, fmt.Errorf("%w: no citus.so beside the PostgreSQL server in %s (nor in `pg_config --pkglibdir`); "+
			"install Citus for this PostgreSQL version (https://github.com/citusdata/citus)", ErrNoCitus, binDir)
	}
	c := &Citus{}
	ok := false
	defer func() {
		if !ok {
			_ = c.Stop()
		}
	}()
	for i := 0; i <= citusWorkers; i++ {
		srv, err := startLocal(ctx, binDir, citusSettings)
		if err != nil {
			return nil, fmt.Errorf("pgtest: start Citus node %d: %w", i, err)
		}
		if i == 0 {
			c.Coordinator = srv
		} else {
			c.Workers = append(c.Workers, srv)
		}
		if err := srv.exec(ctx, "CREATE EXTENSION IF NOT EXISTS citus"); err != nil {
			return nil, fmt.Errorf("pgtest: CREATE EXTENSION citus on node %d: %w", i, err)
		}
	}
	host, port, err := hostPort(c.Coordinator.URL)
	if err != nil {
		return nil, err
	}
	setup := fmt.Sprintf("SELECT citus_set_coordinator_host('%s', %s);", host, port)
	for _, w := range c.Workers {
		host, port, err := hostPort(w.URL)
		if err != nil {
			return nil, err
		}
		setup += fmt.Sprintf("SELECT citus_add_node('%s', %s);", host, port)
	}
	if err := c.Coordinator.exec(ctx, setup); err != nil {
		return nil, fmt.Errorf("pgtest: join the Citus cluster: %w", err)
	}
	ok = true
	return c, nil
}

// Stop stops every node; it returns the first failure.
func (c *Citus) Stop() error {
	var errs []error
	for _, srv := range append([]*Server{c.Coordinator}, c.Workers...) {
		if srv != nil {
			errs = append(errs, srv.Stop())
		}
	}
	return errors.Join(errs...)
}

// asServer is the cluster as one Server: the coordinator's URL, stopping every node.
func (c *Citus) asServer() *Server { return &Server{URL: c.Coordinator.URL, stop: c.Stop} }

// citusLibrary returns the path of citus.so for the server in binDir, or "".
func citusLibrary(ctx context.Context, binDir string) string {
	dirs := []string{filepath.Join(filepath.Dir(binDir), "lib")}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, filepath.Join(binDir, "pg_config"), "--pkglibdir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	if out, err := exec.CommandContext(ctx, "pg_config", "--pkglibdir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "citus.so")); err == nil {
			return filepath.Join(d, "citus.so")
		}
	}
	return ""
}

// RequireCitus returns a throwaway Citus cluster for the test, stopped when it ends.
// It skips the test, saying why, when Citus is not installed.
func RequireCitus(t testing.TB) *Citus {
	t.Helper()
	// The shared server's bound: three servers' start, which outlasted 3 minutes on
	// the 2-core machine at load 60 (initdb killed by the deadline, issue 37).
	ctx, cancel := context.WithTimeout(context.Background(), sharedStartTimeout)
	defer cancel()
	c, err := StartCitus(ctx)
	if errors.Is(err, ErrNoCitus) {
		t.Skipf("skipped: this test needs a Citus cluster: %v", err)
	}
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("pgtest: stop Citus: %v", err)
		}
	})
	return c
}

// distributeForTest distributes the key table of db's schema when EnvCitus is set, in a
// colocation group of its own (testColocation).
func distributeForTest(ctx context.Context, db *DB) error {
	if !CitusMode() {
		return nil
	}
	m, err := migrations.NewMigrator(&migrations.Config{Schema: db.Schema})
	if err != nil {
		return err
	}
	return m.Distribute(ctx, db.Pool, testColocation)
}

// testColocation puts each test's key table in a colocation group of its own, so that
// tests running at once on one cluster do not lock each other's tables: while Citus
// creates shards in a group (a table distributed into it, a partition attached to
// one of its partitioned tables) it holds a share lock on the group's first table
// for the whole transaction, and in one shared group that table is another test's
// key table, whose plain DETACH (a partition's removal) or DROP SCHEMA then waits on
// it. A loaded Citus run of the sweeper's tests saw a detach wait so behind another
// schema's ATTACH PARTITION, 10 s into its transaction; sweeper.TestSweeperPartitions
// had failed so, its detach timing out five times.
var testColocation = &migrations.DistributeOptions{ColocateWith: "none"}

// hostPort returns the host and port of a URL-form connection string.
func hostPort(connString string) (host, port string, err error) {
	u, err := url.Parse(connString)
	if err != nil || u.Hostname() == "" || u.Port() == "" {
		return "", "", fmt.Errorf("pgtest: no host and port in %s", redact(connString))
	}
	return u.Hostname(), u.Port(), nil
}
