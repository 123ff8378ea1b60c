package coord

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// The request log's deadlines never compare two processes' wall clocks
// (issue 18, item 5; docs/coordination.md, "Clocks"). A record carries the
// time its request had left when it was written (header Hams-Timeout), and
// JetStream stamps every stored message with the stream leader's clock. A
// reader turns a record into a deadline on its own clock as
//
//	deadline = stamp + offset + time left
//
// where offset is this process's clock minus the server's, estimated by a
// probe (probeServerClock): the error is half a publish round trip, not
// the hosts' skew. Cut-off times given to the server (a watch's start
// time) are translated the other way.

// serverClockTTL is how long an offset estimate is used before the next
// read that needs one probes again. Clocks drift by parts per million:
// re-probing every few seconds keeps the estimate within a round trip.
const serverClockTTL = 10 * time.Second

// maxRecordTimeout bounds the time left a record may claim: a request
// outlives its record by no more than the log keeps records, so anything
// beyond is clamped (a hostile writer cannot make a record immortal).
const maxRecordTimeout = RequestLogMaxAge

// serverClock caches this process's offset to the JetStream server's
// clock. now is the process clock (time.Now unless a test injects one).
type serverClock struct {
	mu     sync.Mutex
	now    func() time.Time
	offset time.Duration // local - server
	at     time.Time     // local time of the estimate; zero: none yet
}

// SetClock makes c read time from now instead of time.Now (a test's
// skewed clock; a frontend passes its own). Call it before c is used.
func (c *Coord) SetClock(now func() time.Time) { c.clock.now = now }

func (c *Coord) now() time.Time {
	if c.clock.now != nil {
		return c.clock.now()
	}
	return time.Now()
}

// ServerClockOffset returns this process's clock minus the JetStream
// server's, probing the server when the last estimate is older than
// serverClockTTL. A failed probe returns the last estimate when there is
// one, its error only when there is none.
func (c *Coord) ServerClockOffset(ctx context.Context) (time.Duration, error) {
	c.clock.mu.Lock()
	defer c.clock.mu.Unlock()
	now := c.now()
	if !c.clock.at.IsZero() && now.Sub(c.clock.at) >= 0 && now.Sub(c.clock.at) < serverClockTTL {
		return c.clock.offset, nil
	}
	off, err := c.probeServerClock(ctx)
	if err != nil {
		if !c.clock.at.IsZero() {
			// The last estimate stands in (clocks drift by parts per
			// million): a probe fails while the request log's stream
			// elects a leader, and a watch ended on it would restart.
			return c.clock.offset, nil
		}
		return 0, err
	}
	c.clock.offset, c.clock.at = off, c.now()
	return off, nil
}

// probeServerClock publishes an empty message on the request log's probe
// subject (<RequestsSubject>.t: no watch reads it, MaxAge removes it) and
// reads back the time the server stored it with. The stamp was taken
// between the publish and its acknowledgement, so the midpoint of those
// two local times is this process's reading of it.
func (c *Coord) probeServerClock(ctx context.Context) (time.Duration, error) {
	st, err := c.js.Stream(ctx, RequestsStream(c.deployment))
	if err != nil {
		return 0, fmt.Errorf("coord: server clock probe: request log: %w", err)
	}
	sent := c.now()
	ack, err := c.js.Publish(ctx, RequestsSubject(c.deployment)+".t", nil)
	if err != nil {
		return 0, fmt.Errorf("coord: server clock probe: publish: %w", err)
	}
	acked := c.now()
	m, err := st.GetMsg(ctx, ack.Sequence)
	if err != nil {
		return 0, fmt.Errorf("coord: server clock probe: read back %d: %w", ack.Sequence, err)
	}
	local := sent.Add(acked.Sub(sent) / 2)
	return local.Round(0).Sub(m.Time), nil
}

// clampTimeout bounds a record's time left to ±maxRecordTimeout.
func clampTimeout(d time.Duration) time.Duration {
	return min(max(d, -maxRecordTimeout), maxRecordTimeout)
}
