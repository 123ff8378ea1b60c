package frontend

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/testing/logbuf"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// expiryLines are the "request deadline passed unanswered" lines in buf,
// decoded.
func expiryLines(t *testing.T, buf *logbuf.Buffer) []map[string]any {
	t.Helper()
	recs, err := buf.Records()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, m := range recs {
		if m["msg"] == "request deadline passed unanswered" {
			out = append(out, m)
		}
	}
	return out
}

// A request whose model never forwards it expires in the table; the
// frontend logs it with the sink it was waiting for.
func TestExpiredRequestLogsWhatItWaitedFor(t *testing.T) {
	var buf logbuf.Buffer
	e := newEnvWith(t, envOpts{yaml: fmt.Sprintf(testYAML, "300ms"), config: func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&buf, nil))
	}})
	_, err := e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: "echo", RequestId: "stuck-1", StreamId: "drop:a", Inputs: echoInputs(1, 1)})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Predict: %v, want DeadlineExceeded", err)
	}
	var lines []map[string]any
	eventually(t, "the expiry logged", func() bool { lines = expiryLines(t, &buf); return len(lines) > 0 })
	if len(lines) != 1 {
		t.Fatalf("%d expiry lines, want 1: %v", len(lines), lines)
	}
	l := lines[0]
	if l["request_id"] != "stuck-1" || l["service"] != "echo" || l["where"] != "waiting for [a]" || l["level"] != "WARN" {
		t.Fatalf("expiry line %v: want request stuck-1 of echo waiting for [a]", l)
	}
	// A request answered in time logs nothing.
	if _, err := e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: "echo", RequestId: "ok-1", Inputs: echoInputs(1, 2)}); err != nil {
		t.Fatal(err)
	}
	if n := len(expiryLines(t, &buf)); n != 1 {
		t.Fatalf("%d expiry lines after an answered request, want 1", n)
	}
}

// A follower's request that the leader never answers: the follower logs
// that it was waiting for the leader, the leader that it was waiting for
// the model.
func TestExpiredFollowerRequestLogsTheLeaderWait(t *testing.T) {
	co := openLog(t)
	yaml := fmt.Sprintf(testYAML, "400ms")
	var leadBuf, followBuf logbuf.Buffer
	e := newEnvWith(t, envOpts{yaml: yaml, config: func(c *Config) {
		c.Log, c.Name, c.Logger = co, "lead", slog.New(slog.NewJSONHandler(&leadBuf, nil))
	}})
	f2 := e.addFrontend(t, yaml, func(c *Config) {
		c.Log, c.Name, c.Logger = co, "follow", slog.New(slog.NewJSONHandler(&followBuf, nil))
	})
	eventually(t, "leadership settled", func() bool { return e.fe.isLeader() && !f2.fe.isLeader() })
	_, err := f2.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: "echo", RequestId: "stuck-2", StreamId: "drop:a", Inputs: echoInputs(1, 3)})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Predict on the follower: %v, want DeadlineExceeded", err)
	}
	var fl, ll []map[string]any
	eventually(t, "both expiries logged", func() bool {
		fl, ll = expiryLines(t, &followBuf), expiryLines(t, &leadBuf)
		return len(fl) > 0 && len(ll) > 0
	})
	if fl[0]["where"] != "waiting for the leading frontend to inject and answer it" {
		t.Fatalf("follower's expiry line %v", fl[0])
	}
	if ll[0]["where"] != "waiting for [a]" || ll[0]["req_id"] != fl[0]["req_id"] {
		t.Fatalf("leader's expiry line %v (follower's %v)", ll[0], fl[0])
	}
}

// Expiries beyond the burst are counted, not written one by one.
func TestExpiryLogIsRateLimited(t *testing.T) {
	var buf logbuf.Buffer
	el := newExpiryLog(slog.New(slog.NewJSONHandler(&buf, nil)))
	t0 := time.Unix(1000, 0)
	for i := range uint64(expiryLogBurst + 30) {
		el.expired(&call{reqID: i, service: "s"}, t0, "waiting for [m]")
	}
	if n := len(expiryLines(t, &buf)); n != expiryLogBurst {
		t.Fatalf("%d lines at once, want the burst of %d", n, expiryLogBurst)
	}
	el.expired(&call{reqID: 999, service: "s"}, t0.Add(time.Second), "waiting for [m]")
	lines := expiryLines(t, &buf)
	last := lines[len(lines)-1]
	if last["req_id"] != float64(999) || last["not_logged_before"] != float64(30) {
		t.Fatalf("line after the pause %v: want req 999 with not_logged_before 30", last)
	}
}
