package main

// The floor row of section 11: what a sender held to SPEC G1 at the wire
// loses on this machine when it has nothing else to do. No HTTP client and
// no lane: pre-built HTTP/1.1 requests (the lane's head fields and body)
// written whole to keep-alive TCP connections, one write per request, at
// instants one interval apart on the lane's own precise waiter. Each
// request's instant is no earlier than the previous write's return (the
// tiles of shaper.Pacer.Wire: the downstream's stamp lies between the
// instant and the return), and that is all a sender held to G1's
// whole-interval windows with slack 0 may make up after a late write: one
// interval. What the row loses against the limit is what the machine took
// from the sending process's threads: wake-ups that came late, a connection
// whose answer was late, a write that took long.
//
// Why it is here: the lane's shortfall against issue 15's HTTP line is read
// against it in the same run (docs/performance.md, session 31).

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/shaper-dev/shaper/drain"
)

// floorAccount is where the floor row's schedule lost its time: each write
// that returned after the next instant moved the schedule by that much,
// counted under the largest of its three parts.
type floorAccount struct {
	wake  time.Duration // the waiter returned late
	conn  time.Duration // every connection still waited for its answer
	write time.Duration // the write itself took long
	moves int           // writes that moved the schedule
}

// runFloorHTTP sends n requests to rawURL as the floor row.
func runFloorHTTP(rawURL string, n int, row *httpRow) (int, meterResult, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0, meterResult{}, err
	}
	free := make(chan net.Conn, bareWorkers)
	readErr := make(chan error, bareWorkers)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	var answered atomic.Int64
	for range bareWorkers {
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			return 0, meterResult{}, err
		}
		conns = append(conns, c)
		free <- c
		// The connection's answers are read by a goroutine of its own,
		// which hands the connection back when an answer is whole: one
		// request at a time on a connection, as net/http sends them, and
		// every answer of the downstream is httpOK.
		go func() {
			buf := make([]byte, len(httpOK))
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					readErr <- err
					return
				}
				answered.Add(1)
				free <- c
			}
		}()
	}
	body := make([]byte, payloadSize)
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nIdempotency-Key: MEM:", u.RequestURI(), u.Host, len(body))
	req := make([]byte, 0, len(head)+32+len(body))
	iv := time.Duration(float64(time.Second) / httpRate)
	var acct floorAccount
	sent := 0
	m, err := measureRun(func() error {
		w := drain.NewPreciseWaiter()
		w.Bind()
		defer w.Unbind()
		ctx := context.Background()
		at := time.Now()
		for i := range n {
			if _, err := w.Wait(ctx, at, nil); err != nil {
				return err
			}
			woke := time.Now()
			var c net.Conn
			select {
			case c = <-free:
			case err := <-readErr:
				return err
			}
			got := time.Now()
			req = append(append(strconv.AppendInt(append(req[:0], head...), int64(i), 10), "\r\n\r\n"...), body...)
			if _, err := c.Write(req); err != nil {
				return err
			}
			wrote := time.Now()
			sent++
			next := at.Add(iv)
			if wrote.After(next) { // the tile: the next request after this one's write
				lost := wrote.Sub(next)
				acct.moves++
				switch wk, cn, wr := woke.Sub(at), got.Sub(woke), wrote.Sub(got); {
				case wk >= cn && wk >= wr:
					acct.wake += lost
				case cn >= wr:
					acct.conn += lost
				default:
					acct.write += lost
				}
				next = wrote
			}
			at = next
		}
		for answered.Load() < int64(sent) {
			select {
			case err := <-readErr:
				return err
			case <-time.After(time.Millisecond):
			}
		}
		return nil
	})
	row.floor = &acct
	return sent, m, err
}
