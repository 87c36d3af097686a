// The floor of section 11 written in C, outside the Go runtime: what one
// pacing thread that does nothing else loses on this machine at 5,000/s
// (docs/performance.md, session 31). Not built by the go tool (testdata).
//
//   gcc -O2 -pthread -o /tmp/cfloorbin bench/testdata/cfloor/floor.c
//   go build -o /tmp/bench ./bench
//   python3 bench/testdata/cfloor/run.py /tmp/bench /tmp/cfloorbin [burn_us]
//
// Pre-built HTTP/1.1 requests (the bench lane's head fields and a 256-byte
// body) are written whole to 8 keep-alive connections, one at a time, at
// instants one interval apart: clock_nanosleep(TIMER_ABSTIME) to each
// instant, and no instant earlier than the previous write's return (the
// tiles of shaper.Pacer.Wire, as in bench/httpfloor.go). A thread per
// connection reads the answers (each is the downstream's 66-byte httpOK)
// and frees the connection; burn_us > 0 makes it spin that long per answer,
// to see whether CPU spent beside the pacing thread costs rate.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#define NC 8
#define ANSWER 66

static int fds[NC];
static atomic_int busy[NC];
static atomic_long answered;
static long burn;

static long ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void *reader(void *p) {
  long k = (long)p;
  char buf[256];
  int have = 0;
  for (;;) {
    int r = read(fds[k], buf, sizeof buf);
    if (r <= 0) return 0;
    for (have += r; have >= ANSWER; have -= ANSWER) {
      if (burn) for (long end = ns() + burn; ns() < end;) {}
      atomic_fetch_add(&answered, 1);
      atomic_store(&busy[k], 0);
    }
  }
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: floor HOST PORT N [burn_us]\n");
    return 2;
  }
  const char *host = argv[1];
  int port = atoi(argv[2]);
  long n = atol(argv[3]);
  burn = argc > 4 ? atol(argv[4]) * 1000 : 0;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, host, &a.sin_addr);
  pthread_t th[NC];
  for (int i = 0; i < NC; i++) {
    int one = 1;
    fds[i] = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fds[i], (void *)&a, sizeof a)) {
      perror("connect");
      return 1;
    }
    pthread_create(&th[i], 0, reader, (void *)(long)i);
  }
  char body[256] = {0}, req[1024];
  const long iv = 200000; // ns: 5,000/s
  long at = ns(), lost_wake = 0, lost_conn = 0, lost_write = 0;
  for (long i = 0; i < n; i++) {
    struct timespec ts = {at / 1000000000L, at % 1000000000L};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, 0);
    long woke = ns();
    int c = -1;
    while (c < 0)
      for (int k = 0; k < NC && c < 0; k++) {
        int z = 0;
        if (atomic_compare_exchange_strong(&busy[k], &z, 1)) c = k;
      }
    long got = ns();
    int hl = snprintf(req, sizeof req,
                      "POST /jobs HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                      "Content-Length: 256\r\nIdempotency-Key: MEM:%ld\r\n\r\n", host, port, i);
    memcpy(req + hl, body, sizeof body);
    if (write(fds[c], req, hl + sizeof body) != hl + (long)sizeof body) {
      perror("write");
      return 1;
    }
    long wrote = ns(), next = at + iv;
    if (wrote > next) { // the tile: the next request after this one's write
      long lost = wrote - next, wk = woke - at, cn = got - woke, wr = wrote - got;
      if (wk >= cn && wk >= wr) lost_wake += lost;
      else if (cn >= wr) lost_conn += lost;
      else lost_write += lost;
      next = wrote;
    }
    at = next;
  }
  while (atomic_load(&answered) < n) usleep(1000);
  fprintf(stderr, "lost: wake %.1f ms, conn %.1f ms, write %.1f ms\n", lost_wake / 1e6, lost_conn / 1e6,
          lost_write / 1e6);
  return 0;
}
