//go:build linux

package sinks_test

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// loSniffer captures the loopback packets to one TCP port (an AF_PACKET
// socket, which needs CAP_NET_RAW) and stamps every PUB/HPUB to a subject
// with the kernel receive time of the packet carrying its line. Unlike a
// TCP socket's receive queue, a packet socket keeps every packet and its
// stamp apart however late it is read, so it shows what the wire carried
// even when its reader lags — which the proxy's stamps (wireProxy) do not:
// on a loaded 2-core machine the proxy read up to ~10 ms late, TCP had
// merged the segments queued meanwhile, and the proxy saw 1 ms windows of
// 40–90 publishes where the capture saw 12–35. Where the capture is
// permitted, TestNATSWireRate judges the wire on it.
type loSniffer struct {
	f       *os.File
	subject []byte

	mu       sync.Mutex
	streams  map[uint16]*tcpStream // by client port
	stamps   []time.Time
	err      error
	done     chan struct{}
	stopping chan struct{}
}

type tcpStream struct {
	next uint32 // next expected sequence number
	init bool
	sc   pubScanner
}

// startLoSniffer starts capturing the packets to port on lo. It returns an
// error when packet sockets are not permitted.
func startLoSniffer(port int, subject string) (*loSniffer, error) {
	lo, err := interfaceIndex("lo")
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP)))
	if err != nil {
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	// Incoming (PACKET_HOST) IPv4 TCP to port, not fragments.
	const skfAdPkttype = 0xfffff000 + 4 // SKF_AD_OFF + SKF_AD_PKTTYPE
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: skfAdPkttype},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 8, K: unix.PACKET_HOST},
		{Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 9},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 6, K: unix.IPPROTO_TCP},
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 6},
		{Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, Jt: 4, Jf: 0, K: 0x1fff},
		{Code: unix.BPF_LDX | unix.BPF_B | unix.BPF_MSH, K: 0},
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_IND, K: 2},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: uint32(port)},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0x40000},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("attach filter: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: lo}); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("bind lo: %w", err)
	}
	s := &loSniffer{
		f: os.NewFile(uintptr(fd), "lo-sniffer"), subject: []byte(subject),
		streams: map[uint16]*tcpStream{}, done: make(chan struct{}), stopping: make(chan struct{}),
	}
	go s.run()
	return s, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func interfaceIndex(name string) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr); err != nil {
		return 0, err
	}
	return int(ifr.Uint32()), nil
}

func (s *loSniffer) run() {
	defer close(s.done)
	raw, err := s.f.SyscallConn()
	if err != nil {
		s.fail(err)
		return
	}
	buf := make([]byte, 1<<18)
	oob := make([]byte, 64)
	for {
		var n, oobn int
		var rerr error
		err := raw.Read(func(fd uintptr) bool {
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, 0)
			return rerr != unix.EAGAIN
		})
		if err == nil {
			err = rerr
		}
		if err != nil {
			select {
			case <-s.stopping:
			default:
				s.fail(err)
			}
			return
		}
		var stamp time.Time
		if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
			for _, m := range msgs {
				if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
					stamp = time.Unix(int64(binary.NativeEndian.Uint64(m.Data[0:8])), int64(binary.NativeEndian.Uint64(m.Data[8:16])))
				}
			}
		}
		s.packet(buf[:n], stamp)
	}
}

func (s *loSniffer) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

// packet feeds one IPv4 TCP packet to its stream.
func (s *loSniffer) packet(b []byte, stamp time.Time) {
	if len(b) < 20 || b[0]>>4 != 4 {
		return
	}
	ihl := int(b[0]&0xf) * 4
	total := int(binary.BigEndian.Uint16(b[2:4]))
	if total == 0 || total > len(b) {
		total = len(b)
	}
	if ihl+20 > total {
		return
	}
	tcp := b[ihl:total]
	sport := binary.BigEndian.Uint16(tcp[0:2])
	seq := binary.BigEndian.Uint32(tcp[4:8])
	doff := int(tcp[12]>>4) * 4
	flags := tcp[13]
	if doff > len(tcp) {
		return
	}
	payload := tcp[doff:]
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[sport]
	if st == nil {
		st = &tcpStream{sc: pubScanner{subject: s.subject}}
		s.streams[sport] = st
	}
	if flags&0x02 != 0 { // SYN
		st.next, st.init = seq+1, true
		return
	}
	if len(payload) == 0 {
		return
	}
	if !st.init {
		if s.err == nil {
			s.err = fmt.Errorf("sniffer: data on port %d before its SYN", sport)
		}
		return
	}
	d := int32(seq - st.next)
	switch {
	case d > 0:
		if s.err == nil {
			s.err = fmt.Errorf("sniffer: %d bytes missing on port %d", d, sport)
		}
		return
	case d < 0: // a retransmission, maybe with some new data
		if int(-d) >= len(payload) {
			return
		}
		payload = payload[-d:]
	}
	st.next += uint32(len(payload))
	st.sc.feed(payload, stamp, func(at time.Time) { s.stamps = append(s.stamps, at) })
}

// Stop stops the capture and returns the stamps, sorted, and the first
// error met (a missing packet, a dropped one).
func (s *loSniffer) Stop() ([]time.Time, error) {
	var drops uint32
	if raw, err := s.f.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			if st, err := unix.GetsockoptTpacketStats(int(fd), unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
				drops = st.Drops
			}
		})
	}
	close(s.stopping)
	_ = s.f.Close()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.err
	if err == nil && drops > 0 {
		err = fmt.Errorf("sniffer: the kernel dropped %d packets", drops)
	}
	ts := slices.Clone(s.stamps)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	return ts, err
}
