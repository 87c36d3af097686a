package sources

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

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
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded nats on %s: not ready after 10s", listen)
	}
	return s, nil
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
