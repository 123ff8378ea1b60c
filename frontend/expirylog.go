package frontend

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/status"
)

// Expired requests are logged with where they were when their deadline
// passed: a request the client never got an answer for is the failure an
// operator (or a soak's post-mortem) has to place, and by the time the
// client reports it the frontend's table, reply holds and request-log
// state that would say why are gone. One line per expired request, at
// most expiryLogBurst at once and expiryLogEvery apart after that (an
// overloaded frontend expires many at once: the lines it drops are
// counted in the next one).

const (
	expiryLogEvery = 100 * time.Millisecond
	expiryLogBurst = 20
)

// expiryLog writes the rate-limited "request deadline passed" lines.
type expiryLog struct {
	log     *slog.Logger
	limit   *rate.Limiter
	dropped int // lines not written since the last one (guarded by Frontend.mu)
}

func newExpiryLog(log *slog.Logger) *expiryLog {
	return &expiryLog{log: log, limit: rate.NewLimiter(rate.Every(expiryLogEvery), expiryLogBurst)}
}

// expired logs that call c's deadline passed while it was at where
// (caller holds Frontend.mu).
func (e *expiryLog) expired(c *call, now time.Time, where string) {
	if !e.limit.AllowN(now, 1) {
		e.dropped++
		return
	}
	attrs := []any{"req_id", c.reqID, "service", c.service, "where", where}
	if c.key.requestID != "" {
		attrs = append(attrs, "request_id", c.key.requestID)
	}
	if e.dropped > 0 {
		attrs = append(attrs, "not_logged_before", e.dropped)
		e.dropped = 0
	}
	e.log.Warn("request deadline passed unanswered", attrs...)
}

// whereLocked describes where call c waits (caller holds f.mu; before
// the call leaves the table or the holds).
func (f *Frontend) whereLocked(c *call) string {
	switch {
	case c.recording:
		return "its answer was being recorded in the request log"
	case f.table.has(c.reqID):
		return fmt.Sprintf("waiting for %v", f.table.pending[c.reqID].missing())
	}
	if f.holds != nil {
		if r := f.holds.byID[c.reqID]; r != nil {
			return "waiting for durability of " + f.holds.missing(r)
		}
	}
	if f.cfg.Log == nil {
		return "not in the graph"
	}
	if c.injected {
		return "injected by this frontend; neither pending nor held"
	}
	if f.leader {
		return fmt.Sprintf("not injected: this frontend leads (term %d) and did not inject it", f.leadTerm)
	}
	return "waiting for the leading frontend to inject and answer it"
}

// expiredWhere is where of an expiry error of the table or the holds
// ("request 7 of service "s": deadline exceeded waiting for [m]"): the
// same words whereLocked uses.
func expiredWhere(err error) string {
	msg := status.Convert(err).Message()
	if _, where, ok := strings.Cut(msg, "deadline exceeded "); ok {
		return where
	}
	return msg
}

// answered reports whether c has its answer.
func (c *call) answered() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}
