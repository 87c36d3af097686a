package sources

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gofrs/flock"
	"github.com/nats-io/nats-server/v2/server"
)

// StoreLockFile is the file in nats.embedded.store_dir that an embedded
// server holds locked (flock) while it runs; it holds the pid of the
// process that locked it.
const StoreLockFile = ".shaper.lock"

// storeLockWait is how long StartEmbedded waits for the store's lock: the
// previous server of this process may still be releasing it.
const storeLockWait = 2 * time.Second

// StartEmbedded starts the in-process NATS server with JetStream that is the
// product's default (nats.url ""). listen is host:port (port 0 picks a free
// one: read it back with ClientURL); storeDir holds streams and consumer
// state, so a restart of the process finds them again. It returns once the
// server accepts connections, or an error after 10 s.
func StartEmbedded(listen, storeDir string) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("nats.embedded.listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("nats.embedded.listen %q: bad port", listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	} else {
		// Fail at once with the real reason when the port is taken (the
		// server itself would only report "not ready" after the timeout).
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			return nil, fmt.Errorf("nats.embedded.listen %s: %w", listen, err)
		}
		ln.Close()
	}
	// An unwritable store would only show as "not ready" after the timeout.
	if err := os.MkdirAll(storeDir, 0o750); err != nil {
		return nil, fmt.Errorf("nats.embedded.store_dir %q: %w", storeDir, err)
	}
	if f, err := os.CreateTemp(storeDir, ".shaper-write-check-*"); err != nil {
		return nil, fmt.Errorf("nats.embedded.store_dir %q is not writable: %w", storeDir, err)
	} else {
		f.Close()
		os.Remove(f.Name())
	}
	lock, err := lockStore(storeDir)
	if err != nil {
		return nil, err
	}
	opts := &server.Options{
		ServerName:         "shaper-embedded",
		Host:               host,
		Port:               port,
		JetStream:          true,
		StoreDir:           storeDir,
		NoSigs:             true,
		NoLog:              true,
		MaxPayload:         8 << 20,
		JetStreamMaxMemory: 256 << 20,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		_ = lock.Unlock()
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go s.Start()
	go func() { // the lock lives as long as the server
		s.WaitForShutdown()
		_ = lock.Unlock()
	}()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded nats on %s: not ready after 10s", listen)
	}
	return s, nil
}

// lockStore takes the lock of the store directory dir (StoreLockFile), or
// says which process holds it. Two servers on one store directory each
// rewrite the other's stream and consumer files: a new-user pass started a
// second daemon on the first one's store_dir with another port, and after a
// restart the messages JetStream had acknowledged to the first were gone,
// others came twice, and an operator's pause was lost (SPEC G4).
func lockStore(dir string) (*flock.Flock, error) {
	path := filepath.Join(dir, StoreLockFile)
	lock := flock.New(path)
	ctx, cancel := context.WithTimeout(context.Background(), storeLockWait)
	defer cancel()
	ok, err := lock.TryLockContext(ctx, 50*time.Millisecond)
	if err != nil && ctx.Err() == nil {
		return nil, fmt.Errorf("nats.embedded.store_dir %q: lock %s: %w", dir, path, err)
	}
	if !ok {
		holder := "another process"
		if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			holder = "process " + strings.TrimSpace(string(b))
		}
		return nil, fmt.Errorf("nats.embedded.store_dir %q is in use by %s (%s is locked): "+
			"two embedded servers on one store directory lose messages; give each daemon its own store_dir", dir, holder, path)
	}
	// The pid, for the message of the next one (flock(2) locks stay with
	// the lock's own descriptor: writing through another one keeps it).
	_ = os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o640)
	return lock, nil
}

// WaitAcksApplied waits up to timeout until no consumer of the embedded
// server ns has acknowledgements queued or being applied, and reports
// whether that happened. The flush before it only proves that the server
// received the drain's acks and naks: a consumer queues them ("ackMsgs") and
// applies them on its own goroutine, and a shutdown drops what is still
// queued, so the handback nak of the last leftovers was lost and those
// messages came back only after ack_wait (found by TestE2EDrainOnSIGTERM).
func WaitAcksApplied(ns *server.Server, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		busy := false
		// Without All, only queues with pending or in-progress work are listed.
		for name := range *ns.Ipqueuesz(&server.IpqueueszOptions{Filter: "ackMsgs"}) {
			if strings.HasSuffix(name, " ackMsgs") {
				busy = true
			}
		}
		if !busy {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}
