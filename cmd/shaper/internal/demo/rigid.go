package demo

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shaper-dev/shaper/internal/kstamp"
)

// DownstreamCommand is the name of the hidden subcommand that runs the rigid
// downstream in a child process (ServeDownstream); cmd/shaper registers it.
const DownstreamCommand = "demo-downstream"

// rigid is the demo's downstream (SPEC §5): it answers 429 to any request
// that arrives sooner than 1/(1.1 × limit) after the previously accepted one,
// the 10 % margin an operator leaves for network jitter. It runs in a child
// process (`shaper demo-downstream`), as a real downstream would: in the same
// process it would share the Go scheduler with the lane and the embedded NATS
// server, and its handler goroutines would be woken milliseconds late, which
// measures our scheduler instead of the pacer. The child reports every
// request on its stdout; the parent keeps the record here.
type rigid struct {
	minGap time.Duration

	mu       sync.Mutex
	accepted map[string]int // key -> accepted count
	rejected int
	events   []rigidEvent
}

type rigidEvent struct {
	at       time.Time
	accepted bool
	wait     time.Duration // publish -> arrival
}

// RigidGap is the smallest gap the rigid downstream accepts at limit
// messages per second: 1/(1.1 × limit) (SPEC §5).
func RigidGap(limit float64) time.Duration {
	return time.Duration(float64(time.Second) / (1.1 * limit))
}

func newRigid(limit float64) *rigid {
	return &rigid{minGap: RigidGap(limit), accepted: map[string]int{}}
}

// record adds one request reported by the child.
func (r *rigid) record(at time.Time, ok bool, key string, published time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ok {
		r.accepted[key]++
	} else {
		r.rejected++
	}
	r.events = append(r.events, rigidEvent{at: at, accepted: ok, wait: at.Sub(published)})
}

// startRigid starts the downstream child process and feeds r from its
// reports. It returns the downstream's URL and a stop function.
func startRigid(ctx context.Context, limit float64, r *rigid) (string, func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.CommandContext(ctx, exe, DownstreamCommand, "--limit", strconv.FormatFloat(limit, 'g', -1, 64))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe() // the child exits when this closes
	if err != nil {
		return "", nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return "", nil, fmt.Errorf("downstream child did not start")
	}
	addr, _ := strings.CutPrefix(sc.Text(), "listening ")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 4 {
				continue
			}
			at, _ := strconv.ParseInt(f[0], 10, 64)
			pub, _ := strconv.ParseInt(f[3], 10, 64)
			r.record(time.Unix(0, at), f[1] == "1", f[2], time.Unix(0, pub))
		}
	}()
	stop := func() {
		_ = stdin.Close()
		<-done
		_ = cmd.Wait()
	}
	return "http://" + addr + "/callback", stop, nil
}

// ServeDownstream is the child process of the demo: the rigid downstream for
// limit messages per second. It prints "listening ADDR", then one line per
// request ("<arrival unix ns> <1 accepted|0 rejected> <key> <published unix
// ns>") on stdout, until stdin closes.
func ServeDownstream(limit float64, stdin io.Reader, stdout io.Writer) error {
	ln, err := kstamp.Listen("127.0.0.1:0")
	if err != nil {
		return err
	}
	var mu sync.Mutex
	w := bufio.NewWriter(stdout)
	fmt.Fprintf(w, "listening %s\n", ln.Addr())
	w.Flush()
	srv := &rigidServer{minGap: RigidGap(limit), report: func(at time.Time, ok bool, key string, published int64) {
		flag := "0"
		if ok {
			flag = "1"
		}
		mu.Lock()
		fmt.Fprintf(w, "%d %s %s %d\n", at.UnixNano(), flag, strings.ReplaceAll(key, " ", "_"), published)
		w.Flush()
		mu.Unlock()
	}}
	go srv.serve(ln)
	defer ln.Close()
	_, _ = io.Copy(io.Discard, stdin) // until the parent closes stdin
	return nil
}
