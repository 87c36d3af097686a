package sinks_test

import (
	"crypto/rand"
	"encoding/base64"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/internal/swverify"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sinks"
)

// The test vector of the Standard Webhooks specification (its libraries'
// TestWebhookSign): secret, id, timestamp and payload, and the signature.
const (
	specSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	specID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	specTimestamp = 1614265330
	specPayload   = `{"test": 2432232314}`
	specSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

// newSecret returns a fresh Standard Webhooks secret of 24 random bytes.
func newSecret(t *testing.T) string {
	t.Helper()
	key := make([]byte, 24)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return sinks.WebhookSecretPrefix + base64.StdEncoding.EncodeToString(key)
}

// TestSignWebhookSpecVector: the signature of the specification's test
// vector, by SignWebhook and by the sink itself on the wire (the clock at
// the vector's timestamp, the id as the message's Nats-Msg-Id): webhook-id
// is the key, webhook-timestamp the send time in Unix seconds.
func TestSignWebhookSpecVector(t *testing.T) {
	got, err := sinks.SignWebhook(specSecret, specID, time.Unix(specTimestamp, 0), []byte(specPayload))
	if err != nil || got != specSignature {
		t.Fatalf("SignWebhook = %q, %v; want %q", got, err, specSignature)
	}
	// Without the prefix, as the scheme's libraries accept it.
	if got, _ := sinks.SignWebhook(strings.TrimPrefix(specSecret, "whsec_"), specID, time.Unix(specTimestamp, 0), []byte(specPayload)); got != specSignature {
		t.Errorf("SignWebhook without whsec_ = %q, want %q", got, specSignature)
	}

	headers := make(chan http.Header, 1)
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		headers <- r.Header.Clone()
		w.WriteHeader(http.StatusNoContent)
	}))
	s := newHTTP(t, sinks.HTTPConfig{URL: srv.URL, Signing: sinks.SigningConfig{Scheme: sinks.SigningStandardWebhooks, Secrets: []string{specSecret}}},
		sinks.WithClock(func() time.Time { return time.Unix(specTimestamp, 999_000_000) }))
	m := testMessage()
	m.Header[shaper.MsgIDHeader] = []string{specID}
	m.Data = []byte(specPayload)
	if err := send(t, s, m); err != nil {
		t.Fatal(err)
	}
	h := <-headers
	if h.Get("Webhook-Id") != specID || h.Get("Webhook-Timestamp") != strconv.Itoa(specTimestamp) || h.Get("Webhook-Signature") != specSignature {
		t.Errorf("webhook-id %q, webhook-timestamp %q, webhook-signature %q; want %q, %d, %q",
			h.Get("Webhook-Id"), h.Get("Webhook-Timestamp"), h.Get("Webhook-Signature"), specID, specTimestamp, specSignature)
	}
}

// recorder is a loopback HTTP server that keeps every request it got.
type recorder struct {
	mu   sync.Mutex
	reqs []swverify.Request
}

func newRecorder(t *testing.T) (*recorder, string) {
	t.Helper()
	rec := &recorder{}
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.reqs = append(rec.reqs, swverify.Request{Header: r.Header.Clone(), Body: body})
		rec.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	return rec, srv.URL
}

func (rec *recorder) take() []swverify.Request {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := rec.reqs
	rec.reqs = nil
	return out
}

// TestHTTPSigningVerifiedByReferenceLibrary: every request of a signing
// HTTP sink passes the scheme's reference verifier (npm standardwebhooks,
// run by node), and a rotation works: a sink with two secrets (new, old),
// then one rebuilt with the new secret only. The verifier holding the new
// secret accepts every request throughout; the one holding the old secret
// accepts the requests of the first sink and fails every one after the old
// secret was removed. The bodies include non-ASCII text, a redelivery (the
// same webhook-id) and a message without Nats-Msg-Id (the <stream>:<seq>
// key).
func TestHTTPSigningVerifiedByReferenceLibrary(t *testing.T) {
	oldSecret, newSecret := newSecret(t), newSecret(t)
	rec, url := newRecorder(t)
	messages := func(phase string) []*shaper.Message {
		var ms []*shaper.Message
		for i := range 10 {
			m := testMessage()
			m.StreamSeq = uint64(100 + i)
			if i%3 != 0 {
				m.Header[shaper.MsgIDHeader] = []string{phase + "-" + strconv.Itoa(i)}
			}
			m.Data = []byte(`{"phase":"` + phase + `","seq":` + strconv.Itoa(i) + `,"name":"Zoë ✓"}`)
			ms = append(ms, m)
		}
		again := *ms[1]
		again.NumDelivered = 2
		return append(ms, &again)
	}
	sendAll := func(s *sinks.HTTP, ms []*shaper.Message) {
		t.Helper()
		for _, m := range ms {
			if err := send(t, s, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	signing := func(secrets ...string) sinks.HTTPConfig {
		return sinks.HTTPConfig{URL: url + "/hook", Signing: sinks.SigningConfig{Scheme: sinks.SigningStandardWebhooks, Secrets: secrets}}
	}

	before := time.Now().Unix()
	rotating := newHTTP(t, signing(newSecret, oldSecret))
	first := messages("rotating")
	sendAll(rotating, first)
	_ = rotating.Close()
	rotated := newHTTP(t, signing(newSecret)) // the sink rebuilt with the new config
	second := messages("rotated")
	sendAll(rotated, second)
	after := time.Now().Unix()
	sent := append(first, second...)
	all := rec.take() // in send order: each Send waits for its answer
	if len(all) != len(sent) {
		t.Fatalf("the receiver got %d requests, want %d", len(all), len(sent))
	}
	for i, r := range all {
		m := sent[i]
		if id := r.Header.Get("Webhook-Id"); id != m.Key() || id != r.Header.Get("Idempotency-Key") {
			t.Errorf("request %d: webhook-id %q, want the key %q (also the Idempotency-Key)", i, id, m.Key())
		}
		ts, err := strconv.ParseInt(r.Header.Get("Webhook-Timestamp"), 10, 64)
		if err != nil || ts < before || ts > after {
			t.Errorf("request %d: webhook-timestamp %q, want Unix seconds in [%d, %d]", i, r.Header.Get("Webhook-Timestamp"), before, after)
		}
		sigs := strings.Fields(r.Header.Get("Webhook-Signature"))
		wantN := 2
		if i >= len(first) {
			wantN = 1
		}
		if len(sigs) != wantN {
			t.Errorf("request %d: %d signatures %q, want one per secret (%d)", i, len(sigs), sigs, wantN)
		}
	}

	res := swverify.Verify(t, []string{newSecret, oldSecret}, all)
	for i, per := range res {
		phase := "with both secrets"
		if i >= len(first) {
			phase = "after the rotation"
		}
		if per[0] != "" {
			t.Errorf("request %d (%s): the verifier with the new secret rejected it: %s", i, phase, per[0])
		}
		switch {
		case i < len(first) && per[1] != "":
			t.Errorf("request %d (%s): the verifier with the old secret rejected it: %s", i, phase, per[1])
		case i >= len(first) && per[1] == "":
			t.Errorf("request %d (%s): the verifier with the removed old secret accepted it", i, phase)
		}
	}
	t.Logf("%d requests with both secrets, %d after the rotation, judged by standardwebhooks", len(first), len(second))
}

// TestNewHTTPSigningRejects: sink.signing is checked when the sink is built,
// each problem under its key; no error quotes a secret.
func TestNewHTTPSigningRejects(t *testing.T) {
	const secretText = "whsec_not*base64*secret"
	for _, tc := range []struct {
		name    string
		signing sinks.SigningConfig
		headers map[string]string
		want    string
	}{
		{"unknown scheme", sinks.SigningConfig{Scheme: "hmac", Secrets: []string{specSecret}}, nil, `signing.scheme "hmac": unknown`},
		{"no secret", sinks.SigningConfig{Scheme: sinks.SigningStandardWebhooks}, nil, "signing.secrets: at least one"},
		{"not base64", sinks.SigningConfig{Scheme: sinks.SigningStandardWebhooks, Secrets: []string{specSecret, secretText}}, nil, "signing.secrets[1]: not whsec_ followed by standard base64"},
		{"empty after the prefix", sinks.SigningConfig{Scheme: sinks.SigningStandardWebhooks, Secrets: []string{"whsec_"}}, nil, "signing.secrets[0]: empty"},
		{"no prefix, not base64", sinks.SigningConfig{Scheme: sinks.SigningStandardWebhooks, Secrets: []string{"bogus"}}, nil, "(bad input at byte 4 of the key)"},
		{"the prefix, not base64", sinks.SigningConfig{Scheme: sinks.SigningStandardWebhooks, Secrets: []string{"whsec_bogus"}}, nil, "(bad input at byte 4 after the prefix)"},
		{"secrets without a scheme", sinks.SigningConfig{Secrets: []string{specSecret}}, nil, "signing.scheme: required"},
		{"a configured signature header", sinks.SigningConfig{Scheme: sinks.SigningStandardWebhooks, Secrets: []string{specSecret}},
			map[string]string{"webhook-signature": "v1,x"}, "headers.webhook-signature: reserved"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sinks.NewHTTP(sinks.HTTPConfig{URL: "http://127.0.0.1:1/cb", Headers: tc.headers, Signing: tc.signing})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewHTTP = %v, want an error with %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "base64*secret") || strings.Contains(err.Error(), "MfKQ9r8") {
				t.Errorf("the error quotes a secret: %v", err)
			}
		})
	}
}
