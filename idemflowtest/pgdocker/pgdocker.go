package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

// Container settings for the dockertest fallback.
const (
	dockerRepository   = "postgres"
	dockerTag          = "15"
	dockerStartTimeout = 2 * time.Minute // after the image is pulled
)

// errNoDocker means no Docker daemon answered; Start then reports what to install.
var errNoDocker = errors.New("no Docker daemon answered")

// startDocker runs a postgres:15 container, published on the loopback interface only
// (trust authentication must not be reachable from the network) unless the daemon is
// remote (DOCKER_HOST=tcp://host:port), in which case it is published on that host.
func startDocker(ctx context.Context, extra []string) (*Server, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, fmt.Errorf("%w (%v)", errNoDocker, err)
	}
	if err := pool.Client.PingWithContext(ctx); err != nil {
		return nil, fmt.Errorf("%w (%v)", errNoDocker, err)
	}

	bindIP, connectHost := "127.0.0.1", "127.0.0.1"
	if u, err := url.Parse(os.Getenv("DOCKER_HOST")); err == nil && u.Scheme == "tcp" && u.Hostname() != "" {
		bindIP, connectHost = "", u.Hostname()
	}
	cmd := []string{"postgres", "-c", "max_connections=300", "-c", "shared_buffers=128MB", "-c", "fsync=on", "-c", "TimeZone=UTC", "-c", "max_parallel_workers_per_gather=0"}
	for _, s := range extra {
		cmd = append(cmd, "-c", s)
	}
	opts := &dockertest.RunOptions{
		Repository: dockerRepository,
		Tag:        dockerTag,
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
		return nil, fmt.Errorf("pgtest: a Docker daemon answered but the %s:%s container did not start: %w",
			dockerRepository, dockerTag, err)
	}
	srv := &Server{stop: func() error {
		var gone *docker.NoSuchContainer
		if err := pool.Purge(res); err != nil && !errors.As(err, &gone) { // AutoRemove may win the race
			return fmt.Errorf("pgtest: remove container %s: %w", res.Container.ID, err)
		}
		return nil
	}}
	port := res.GetPort("5432/tcp")
	if port == "" {
		return nil, errors.Join(fmt.Errorf("pgtest: container %s published no port for 5432/tcp", res.Container.ID), srv.Stop())
	}
	srv.URL = fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", net.JoinHostPort(connectHost, port))
	if err := waitReady(ctx, srv.URL, nil, dockerStartTimeout); err != nil {
		return nil, errors.Join(fmt.Errorf("pgtest: %s:%s container: %w", dockerRepository, dockerTag, err), srv.Stop())
	}
	return srv, nil
}
