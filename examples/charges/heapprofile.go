package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"time"
)

// envHeapProfileDir and envHeapProfileEvery make serve and worker write a heap profile
// (runtime/pprof's "heap" profile, after a collection, gzipped protocol buffers) into
// the directory every that long, as heap-<pid>-<n>.pb.gz: the soak's workers write
// them, so that a heap that grows can be compared between two times with `go tool
// pprof -base earlier later`. Both set, or neither.
const (
	envHeapProfileDir   = "CHARGES_HEAP_PROFILE_DIR"
	envHeapProfileEvery = "CHARGES_HEAP_PROFILE_EVERY"
)

// heapProfileRate is runtime.MemProfileRate in a process that writes heap profiles: one
// sample per 4 KiB allocated on average. The default, one per 512 KiB, leaves a worker
// whose live heap is 2 MiB with a handful of samples, too few to tell what grew.
const heapProfileRate = 4 << 10

func init() {
	if os.Getenv(envHeapProfileDir) != "" {
		runtime.MemProfileRate = heapProfileRate // before the process allocates much
	}
}

// startHeapProfiles starts the heap profile writer when the variables are set; it stops
// when ctx ends. A directory that cannot be made, an interval that is not a positive
// duration, or one variable without the other is an error. A profile that cannot be
// written is reported on stderr and the next one tried.
func startHeapProfiles(ctx context.Context) error {
	dir, raw := os.Getenv(envHeapProfileDir), os.Getenv(envHeapProfileEvery)
	if dir == "" && raw == "" {
		return nil
	}
	if dir == "" || raw == "" {
		return fmt.Errorf("%s and %s go together", envHeapProfileDir, envHeapProfileEvery)
	}
	every, err := time.ParseDuration(raw)
	if err != nil || every <= 0 {
		return fmt.Errorf("%s=%q: want a positive duration such as 15m", envHeapProfileEvery, raw)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("%s: %w", envHeapProfileDir, err)
	}
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			path := filepath.Join(dir, fmt.Sprintf("heap-%d-%d.pb.gz", os.Getpid(), n))
			if err := writeHeapProfile(path); err != nil {
				fmt.Fprintf(os.Stderr, "charges: heap profile: %v\n", err)
			}
		}
	}()
	return nil
}

// writeHeapProfile writes the heap profile, as of a collection made now, to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC() // the profile's in-use figures are as of the last collection
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
