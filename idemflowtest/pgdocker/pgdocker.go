// Package pgdocker starts a throwaway postgres:15 container through dockertest, for
// the tests of a machine that has a Docker daemon but no PostgreSQL server binaries.
// It is a module of its own (github.com/idemflow/idemflow/idemflowtest/pgdocker) so
// that Docker's client libraries are in the module graph of only those who ask for it:
//
//	func TestMain(m *testing.M) {
//		idemflowtest.MainWith(m, idemflowtest.Options{Fallback: pgdocker.Start})
//	}
//
// The test kit uses the container only when TEST_DATABASE_URL is not set and no local
// server binaries are found, and removes it when the tests end.
package pgdocker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"

	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

// The container's image.
const (
	Repository = "postgres"
	Tag        = "15"
)

// ErrNoDaemon means no Docker daemon answered (DOCKER_HOST, or the default socket).
var ErrNoDaemon = errors.New("pgdocker: no Docker daemon answered")

// Start runs a postgres:15 container with trust authentication and the given extra
// server settings ("name=value"), and returns a superuser URL to its postgres database
// and a function that removes the container. The port is published on the loopback
// interface only (trust authentication must not be reachable from the network) unless
// the daemon is remote (DOCKER_HOST=tcp://host:port), in which case it is published on
// that host. Start returns once the container runs, which may be before the server
// accepts connections: the test kit waits for that. Without a daemon it returns an error
// wrapping ErrNoDaemon. Its signature is idemflowtest's Options.Fallback.
func Start(ctx context.Context, settings []string) (string, func() error, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return "", nil, fmt.Errorf("%w (%v)", ErrNoDaemon, err)
	}
	if err := pool.Client.PingWithContext(ctx); err != nil {
		return "", nil, fmt.Errorf("%w (%v)", ErrNoDaemon, err)
	}

	bindIP, connectHost := "127.0.0.1", "127.0.0.1"
	if u, err := url.Parse(os.Getenv("DOCKER_HOST")); err == nil && u.Scheme == "tcp" && u.Hostname() != "" {
		bindIP, connectHost = "", u.Hostname()
	}
	cmd := []string{"postgres", "-c", "max_connections=300", "-c", "shared_buffers=128MB", "-c", "fsync=on", "-c", "TimeZone=UTC", "-c", "max_parallel_workers_per_gather=0"}
	for _, s := range settings {
		cmd = append(cmd, "-c", s)
	}
	opts := &dockertest.RunOptions{
		Repository: Repository,
		Tag:        Tag,
		Env: []string{
			"POSTGRES_USER=postgres",
			"POSTGRES_DB=postgres",
			"POSTGRES_HOST_AUTH_METHOD=trust",
		},
		Cmd:          cmd,
		ExposedPorts: []string{"5432/tcp"},
		PortBindings: map[docker.Port][]docker.PortBinding{
			"5432/tcp": {{HostIP: bindIP, HostPort: ""}}, // any free host port
		},
		Labels: map[string]string{"io.idemflow.pgtest": "true"},
	}
	res, err := pool.RunWithOptions(opts, func(hc *docker.HostConfig) {
		hc.PublishAllPorts = false // only the binding above
		hc.AutoRemove = true
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
		hc.ShmSize = 256 << 20
	})
	if err != nil {
		return "", nil, fmt.Errorf("pgdocker: a Docker daemon answered but the %s:%s container did not start: %w",
			Repository, Tag, err)
	}
	stop := func() error {
		var gone *docker.NoSuchContainer
		if err := pool.Purge(res); err != nil && !errors.As(err, &gone) { // AutoRemove may win the race
			return fmt.Errorf("pgdocker: remove container %s: %w", res.Container.ID, err)
		}
		return nil
	}
	port := res.GetPort("5432/tcp")
	if port == "" {
		return "", nil, errors.Join(fmt.Errorf("pgdocker: container %s published no port for 5432/tcp", res.Container.ID), stop())
	}
	connString := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", net.JoinHostPort(connectHost, port))
	return connString, stop, nil
}
