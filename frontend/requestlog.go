package frontend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/run"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// RequestLog is what the frontend needs of the request log
// (*coord.Coord satisfies it; see internal/coord/requestlog.go).
type RequestLog interface {
	FrontendIncarnation(ctx context.Context) (uint64, error)
	LogRequest(ctx context.Context, r *coord.LoggedRequest) (existing *coord.LoggedRequest, err error)
	RecordReply(ctx context.Context, r *coord.LoggedReply) (existing *coord.LoggedReply, err error)
	LookupReply(ctx context.Context, reqID uint64) (*coord.LoggedReply, error)
	WatchReplies(ctx context.Context, fn func(*coord.LoggedReply)) error
	WatchRequests(ctx context.Context, lookback time.Duration, fn func(r *coord.LoggedRequest, backlog bool)) error
}

// recording is an answer waiting to be recorded before it is released.
type recording struct {
	c    *call
	resp *hamsv1.PredictResponse
	err  error
}

const (
	// recordWorkers bounds the reply records written concurrently.
	recordWorkers = 32
	// recordGrace is how long past a request's deadline recording its
	// answer is retried before the call is answered Unavailable.
	recordGrace = 5 * time.Second
	// takeoverSlack widens the window of logged requests a new leader
	// scans beyond the request timeout (the log's stamps and the
	// frontend's own clock are compared through an estimated offset:
	// internal/coord/serverclock.go).
	takeoverSlack = 2 * time.Second
	// sinkResendTimeout bounds one Resend call to a sink model.
	sinkResendTimeout = 5 * time.Second
	// logAttemptTimeout bounds the logging of an accepted request.
	logAttemptTimeout = coord.OpTimeout
)

// startLog allocates this process's incarnation and puts it in the high
// bits of every req_id it hands out.
func (f *Frontend) startLog(ctx context.Context) error {
	backoff := minBackoff
	for {
		inc, err := f.cfg.Log.FrontendIncarnation(ctx)
		if err == nil {
			f.mu.Lock()
			f.table.next = inc << (64 - coord.IncarnationBits)
			f.mu.Unlock()
			f.log.Info("frontend incarnation allocated", "incarnation", inc, "first_req_id", (inc<<(64-coord.IncarnationBits))+1)
			return nil
		}
		f.log.Warn("allocate frontend incarnation; retrying", "err", err, "backoff", backoff)
		if !run.Sleep(ctx, backoff) {
			return fmt.Errorf("allocate incarnation: %w", err)
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// runLog runs the loops of the request log until ctx ends: the reply
// watcher (answers recorded by any frontend), the recorder (this
// frontend's answers, recorded before release), the consumer of the log
// (a follower mirrors it, the leader injects from it), the sweep and the
// leadership loop. It returns once every goroutine they started ended.
func (f *Frontend) runLog(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(5)
	go func() { defer wg.Done(); f.sweepLoop(ctx) }()
	go func() {
		defer wg.Done()
		backoff := minBackoff
		for {
			err := f.cfg.Log.WatchReplies(ctx, f.onReplyRecord)
			if ctx.Err() != nil {
				return
			}
			f.log.Warn("reply watch ended; restarting", "err", err, "backoff", backoff)
			if !run.Sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, maxBackoff)
		}
	}()
	go func() { defer wg.Done(); f.recorderLoop(ctx) }()
	go func() { defer wg.Done(); f.consumeLog(ctx) }()
	go func() { defer wg.Done(); f.leadershipLoop(ctx) }()
	wg.Wait()
	return nil
}

// sweepEvery is the period of the backstop that looks up the answers of
// calls waiting for another frontend (the reply watch is a plain
// subscription: records written while it was down are missed).
const sweepEvery = time.Second

// sweepBatch bounds the look-ups of one sweep.
const sweepBatch = 256

// sweepLoop looks up, every sweepEvery, the recorded answers of calls that
// wait for another frontend's answer and have waited a full period.
func (f *Frontend) sweepLoop(ctx context.Context) {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	seen := map[uint64]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f.mu.Lock()
		var ids []uint64
		next := map[uint64]bool{}
		for id, c := range f.calls {
			if c.injected || c.recording {
				continue
			}
			next[id] = true
			if seen[id] && len(ids) < sweepBatch {
				ids = append(ids, id)
			}
		}
		f.mu.Unlock()
		seen = next
		for _, id := range ids {
			rec, err := f.cfg.Log.LookupReply(ctx, id)
			if err == nil {
				f.onReplyRecord(rec)
			}
		}
	}
}

// The takeover rule (docs/recovery.md, "Frontend and manager failover").
//
// A frontend starts to lead at the moment T it sets f.leader (under mu,
// with f.leadTerm incremented). The topology names it only after the
// previous leader was declared dead, and an answer is released only after
// its reply record reached JetStream (the recorder releases on the
// publish acknowledgement; a follower releases a record it received, and
// JetStream stores what it routes). So a reply record of any answer
// released before T is stored before T, and a look-up (LookupReply: a
// read of the stored stream) that **starts after T** finds it. The new
// leader therefore injects a logged request only when
//
//  1. it was logged after T: its stream sequence is at least the fence, the
//     sequence of a record this frontend began to log after T
//     (f.leadFence; 0 while unknown), so nobody but this leader can have
//     injected and answered it; or
//  2. a look-up begun after T found no reply record (unanswered, below):
//     the mirror's open requests at T (adoptOpen), the records the log
//     consumer delivers late (onLogged, checkLater: the consumer lags
//     behind the reply watch and the log, by any amount), and a client's
//     retry that joins a logged attempt (joinLogged).
//
// What the reply watch has not delivered yet is therefore never trusted to
// mean "unanswered"; what it has delivered (the mirror's answered set)
// only saves look-ups. A look-up that fails is retried until the
// request's deadline; it never counts as "no record". Should a record
// reach JetStream after a look-up missed it anyway (a deposed leader that
// was not dead, or a record still in the server's queue), the injected
// call is answered from that record when the reply watch or the sweep
// delivers it (onReplyRecord), and its own answer loses the first-writer
// race (recordOne): the client is never answered differently.

// takeoverLookups bounds the answer look-ups in flight at once (at a
// takeover, and behind the log consumer).
const takeoverLookups = 16

// leadershipLoop follows the topology: the frontend the Resolver names for
// config.Frontend receives every sink edge, so it is the one frontend that
// injects requests (two frontends sending on frontend -> entry edges would
// fence each other off at the entry models' receivers). On taking over it
// injects the open requests of its log mirror that a look-up finds
// unanswered and asks the sink models to resend what they keep for the
// frontend; while it leads, the log consumer injects the records it
// delivers (onLogged).
func (f *Frontend) leadershipLoop(ctx context.Context) {
	var (
		cancelLead context.CancelFunc
		leadWG     sync.WaitGroup
	)
	stop := func() {
		if cancelLead != nil {
			cancelLead()
			leadWG.Wait()
			cancelLead = nil
			f.mu.Lock()
			f.leader = false
			f.leadTerm++
			f.leadFence = 0
			f.mu.Unlock()
			f.log.Info("frontend no longer leads: the topology names another frontend")
		}
	}
	defer stop()
	for {
		changed := f.cfg.Resolver.Changed()
		addr, _, ok := f.cfg.Resolver.Resolve(config.Frontend)
		lead := ok && addr == f.cfg.Address
		switch {
		case lead && cancelLead == nil:
			t0 := time.Now()
			f.mu.Lock()
			// T of the takeover rule: from here on, a record the consumer
			// delivers finds leader set (onLogged), and what it delivered
			// before is in the mirror, taken now. Both are injected only
			// after a look-up that starts after this point.
			f.leader = true
			f.leadTerm++
			f.leadFence = 0
			term := f.leadTerm
			// Entry receivers follow the newest sender incarnation of the
			// frontend edge: start a new one on every entry edge, or a
			// frontend created before the previous leader would be refused
			// as stale (nothing is resent: After is the largest position).
			for _, snd := range f.senders {
				snd.Resend(edge.ResendSpec{After: ^uint64(0)})
			}
			open := f.mir.take(f.now())
			f.mu.Unlock()
			f.log.Info("frontend leads: injecting the open requests of the log", "open", len(open), "term", term)
			lctx, cancel := context.WithCancel(ctx)
			cancelLead = cancel
			leadWG.Add(2)
			go func() {
				defer leadWG.Done()
				n := f.adoptOpen(lctx, open, term)
				f.log.Info("takeover: open requests injected", "injected", n, "open", len(open), "elapsed", time.Since(t0))
			}()
			go func() {
				defer leadWG.Done()
				f.resendSinks(lctx)
				f.log.Info("takeover: sink resends done", "elapsed", time.Since(t0))
			}()
		case !lead && cancelLead != nil:
			stop()
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// retakeEntry is called when entry model e refused this frontend's sender
// as stale: another frontend sent on the frontend -> e edge with a newer
// sender incarnation. Two frontends can both believe they lead for a
// moment (one of them on a topology that is about to change: a frontend
// restarted in place registers while the manager declares its previous
// process dead); once the other stops, the receiver would refuse the
// real leader forever. A leader therefore starts a newer incarnation (its
// unacknowledged items are sent again in it); a follower sends nothing
// and leaves the edge alone. Two frontends that both lead keep taking
// the edge from each other until the topology settles.
func (f *Frontend) retakeEntry(e string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.leader || f.closed {
		return
	}
	f.m.retakes.Inc()
	f.log.Info("entry model refused this frontend's sender as stale; starting a newer incarnation", "model", e)
	f.senders[e].Resend(edge.ResendSpec{After: ^uint64(0)})
}

// consumeLog consumes the request log until ctx ends, following or
// leading, restarting the watch with backoff; a watch starts one request
// timeout (plus slack) back. It returns once the look-ups it started
// ended.
func (f *Frontend) consumeLog(ctx context.Context) {
	var checks sync.WaitGroup
	defer checks.Wait()
	sem := make(chan struct{}, takeoverLookups)
	backoff := minBackoff
	for {
		err := f.cfg.Log.WatchRequests(ctx, f.timeout+takeoverSlack, func(r *coord.LoggedRequest, backlog bool) {
			f.onLogged(ctx, r, backlog, sem, &checks)
		})
		if ctx.Err() != nil {
			return
		}
		f.log.Warn("request log watch ended; restarting", "err", err, "backoff", backoff)
		if !run.Sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// ownReqIDLocked reports whether reqID was handed out by this process.
func (f *Frontend) ownReqIDLocked(reqID uint64) bool {
	shift := 64 - coord.IncarnationBits
	return reqID>>shift == f.table.next>>shift
}

// onLogged handles one record the log consumer delivers. A request past
// its deadline, one this frontend injected or answers already, and one of
// its own whose call is over are ignored. A follower keeps the rest in its
// log mirror (and looks up the answer of a backlog record meanwhile, so a
// takeover finds few open requests). The leader injects the record at
// once when it was logged after the takeover (its sequence is at least
// the fence), leaves it alone when the mirror saw its answer, and
// otherwise looks its answer up first (checkLater): the takeover rule
// above.
func (f *Frontend) onLogged(ctx context.Context, r *coord.LoggedRequest, backlog bool, sem chan struct{}, wg *sync.WaitGroup) {
	now := f.now()
	if !now.Before(r.Deadline) {
		return
	}
	f.mu.Lock()
	c := f.calls[r.ReqID]
	if f.closed || (c != nil && (c.injected || c.recording)) || (c == nil && f.ownReqIDLocked(r.ReqID) && !f.mir.mayBeLogged(r.ReqID, now)) {
		f.mu.Unlock()
		return
	}
	if c != nil && f.leader && c.loggedIn == f.leadTerm {
		// predictLogged injects it when the log acknowledges it, which
		// may come after this delivery. The delivery proves the record
		// stored: should the acknowledgement be lost (a NATS server that
		// stored it and died), predictLogged goes on with it instead of
		// answering Unavailable, since a retry would join this record and
		// wait for this leader to inject it.
		c.logDelivered, c.logSeq = true, r.Seq
		f.mu.Unlock()
		return
	}
	term := f.leadTerm
	if !f.leader {
		kept := f.mir.logged(r, now)
		f.mu.Unlock()
		if kept && backlog {
			f.checkLater(ctx, r, term, false, sem, wg)
		}
		return
	}
	if f.mir.isAnswered(r.ReqID) {
		f.mu.Unlock()
		return
	}
	logged := f.leadFence != 0 && r.Seq >= f.leadFence
	f.mu.Unlock()
	if logged {
		f.adopt(r, term)
		return
	}
	f.checkLater(ctx, r, term, true, sem, wg)
}

// checkLater looks up the answer of logged request r on a goroutine of its
// own (at most cap(sem) at a time; it waits for a slot, so a long backlog
// slows the consumer rather than piling up goroutines) and, when there is
// none and inject is set, injects it as the leader of term.
func (f *Frontend) checkLater(ctx context.Context, r *coord.LoggedRequest, term uint64, inject bool, sem chan struct{}, wg *sync.WaitGroup) {
	goBounded(ctx, sem, wg, func() {
		if f.unanswered(ctx, r) && inject {
			f.adopt(r, term)
		}
	})
}

// goBounded runs fn in a goroutine owned by wg once it holds a slot of sem
// (it waits for one, so a long backlog slows the caller rather than piling
// up goroutines); it reports false, starting nothing, when ctx ends first.
func goBounded(ctx context.Context, sem chan struct{}, wg *sync.WaitGroup, fn func()) bool {
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() { <-sem }()
		fn()
	}()
	return true
}

// unanswered reports whether the log holds no reply record for r: true
// only on the log's word (coord.ErrNoRecord). A recorded answer is applied
// (onReplyRecord). A failed look-up is retried with backoff until r's
// deadline or ctx ends, and then counts as answered: injecting on a guess
// could run an answered request again.
func (f *Frontend) unanswered(ctx context.Context, r *coord.LoggedRequest) bool {
	backoff := minBackoff
	for {
		rec, err := f.cfg.Log.LookupReply(ctx, r.ReqID)
		if err == nil {
			f.onReplyRecord(rec)
			return false
		}
		if errors.Is(err, coord.ErrNoRecord) {
			return true
		}
		if ctx.Err() != nil || !f.now().Before(r.Deadline) {
			return false
		}
		f.log.Warn("look up answer of a logged request; retrying", "req_id", r.ReqID, "err", err, "backoff", backoff)
		if !run.Sleep(ctx, backoff) {
			return false
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// adoptOpen injects, as the leader of term, the open requests of the
// mirror taken at the takeover: their answers are looked up first, all at
// once (at most takeoverLookups in flight; a look-up begun after the
// takeover sees every answer released before it), then the unanswered
// ones are injected in log order. It returns how many were injected.
func (f *Frontend) adoptOpen(ctx context.Context, open []*coord.LoggedRequest, term uint64) int {
	none := make([]bool, len(open))
	sem := make(chan struct{}, takeoverLookups)
	var wg sync.WaitGroup
	for i, r := range open {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return 0
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			none[i] = f.unanswered(ctx, r)
		}()
	}
	wg.Wait()
	n := 0
	for i, r := range open {
		if none[i] && ctx.Err() == nil && f.adopt(r, term) {
			n++
		}
	}
	return n
}

// adopt injects logged request r as the leader of term unless it is past
// its deadline, injected or answered here already, or this frontend no
// longer leads in term (a follower again keeps it in its mirror). The
// caller established that r may be injected (the takeover rule above). A
// record is checked as predict checks a client's request (the log is
// outside bytes too: another frontend's view of the deployment, or a
// record nobody's frontend wrote); a refused one is answered with the
// refusal, recorded like any answer, so a frontend waiting for it answers
// its client. It reports whether r was injected.
func (f *Frontend) adopt(r *coord.LoggedRequest, term uint64) bool {
	now := f.now()
	if !now.Before(r.Deadline) {
		return false
	}
	svc := f.services[r.Request.GetService()]
	if svc == nil {
		f.log.Warn("logged request names an unknown service; skipped", "req_id", r.ReqID, "service", r.Request.GetService())
		return false
	}
	refused := f.checkLogged(svc, r.Request)
	if refused != nil {
		f.log.Warn("logged request refused", "req_id", r.ReqID, "logged_by", r.Frontend, "err", refused)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	if !f.leader || f.leadTerm != term {
		if !f.leader {
			f.mir.logged(r, now) // for the next takeover (a no-op if answered)
		}
		return false
	}
	if f.mir.isAnswered(r.ReqID) {
		return false
	}
	own := f.ownReqIDLocked(r.ReqID)
	c := f.calls[r.ReqID]
	switch {
	case c == nil && own && !f.mir.mayBeLogged(r.ReqID, now):
		return false // this process's call is over (answered or failed)
	case c == nil:
		key := idemKey{service: svc.name, requestID: r.Request.GetRequestId()}
		c = &call{reqID: r.ReqID, service: svc.name, key: key, hasKey: key.requestID != "", done: make(chan struct{})}
		if c.hasKey {
			if f.inflight[key] == nil {
				f.inflight[key] = c
			} else {
				c.hasKey = false
			}
		}
		f.calls[c.reqID] = c
	case c.injected || c.recording:
		return false
	}
	c.req, c.deadline = r.Request, r.Deadline
	if refused != nil {
		c.injected = true // this frontend answers it, so it records the answer
		f.finishLocked(c, nil, refused, true)
		return false
	}
	if !own {
		f.m.adopted.Inc()
	}
	f.log.Debug("logged request injected", "req_id", r.ReqID, "logged_by", r.Frontend, "seq", r.Seq)
	f.injectLocked(c, svc)
	return true
}

// checkLogged checks a logged request as predict checks a client's.
func (f *Frontend) checkLogged(svc *serviceInfo, req *hamsv1.PredictRequest) error {
	if err := svc.validateInputs(req.GetInputs(), f.maxDecoded); err != nil {
		return err
	}
	if err := svc.checkRows(req.GetInputs(), f.maxRows); err != nil {
		return err
	}
	if err := svc.checkFinite(req.GetInputs()); err != nil {
		return err
	}
	return f.checkItemSize(svc, req)
}

// injectLocked sends a logged request into the graph: the table waits for
// its sinks, and one item per entry model leaves (under mu, so edge_seq
// order equals injection order on every entry edge). Sink items that
// arrived before (kept among the orphans) are delivered at once.
func (f *Frontend) injectLocked(c *call, svc *serviceInfo) {
	req := c.req
	c.injected = true
	f.table.addID(c.reqID, svc.name, req.GetRequestId(), svc.sinks, c.deadline)
	if next, _ := f.table.nextDeadline(); next.Equal(c.deadline) {
		signal(f.kick)
	}
	streamID := req.GetStreamId()
	if streamID == "" {
		streamID = req.GetRequestId()
	}
	if streamID == "" {
		streamID = fmt.Sprint(c.reqID)
	}
	c.items = c.items[:0]
	for _, e := range svc.entries {
		it := &hamsv1.Item{
			ReqId:            c.reqID,
			Service:          svc.name,
			StreamId:         streamID,
			Tensors:          req.GetInputs(),
			DeadlineUnixNano: c.deadline.UnixNano(),
		}
		c.items = append(c.items, it)
		f.senders[e].Send(it)
	}
	for _, o := range f.orphans.take(c.reqID) {
		f.deliverLocked(o.from, o.it)
	}
}

// predictLogged is predict's path with a request log: the request is
// logged (JetStream acknowledged it) before it enters the graph; a request
// whose client request_id was logged already (another attempt, on any
// frontend) joins that attempt. The leader injects the request itself
// when it began to log it while leading (the takeover rule: nobody else
// can have answered it), after a look-up when the takeover happened while
// it was being logged; another frontend waits for the answer the leader
// records.
func (f *Frontend) predictLogged(ctx context.Context, svc *serviceInfo, req *hamsv1.PredictRequest, key idemKey, deadline time.Time) (*hamsv1.PredictResponse, error) {
	hasKey := key.requestID != ""
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, status.Error(codes.Unavailable, ErrShutdown.Error())
	}
	if hasKey && f.inflight[key] != nil {
		// Joined while this caller validated: wait on that attempt.
		c := f.inflight[key]
		c.waiters++
		f.mu.Unlock()
		return f.wait(ctx, c)
	}
	c := &call{service: svc.name, key: key, hasKey: hasKey, waiters: 1, done: make(chan struct{}), req: req, deadline: deadline}
	c.reqID = f.table.newID()
	f.calls[c.reqID] = c
	if hasKey {
		f.inflight[key] = c
	}
	// The term in which the log write begins: if this frontend leads in it
	// and still does when the write is acknowledged, the record was stored
	// after the takeover.
	term, leading := f.leadTerm, f.leader
	if leading {
		c.loggedIn = term
	}
	f.mu.Unlock()

	t0 := time.Now()
	// One attempt: a log write in flight when NATS dies never gets its
	// acknowledgement, so it is bounded well inside the client's deadline;
	// the client's retry (same request_id, on any frontend) finds the
	// record if it was written after all.
	lr := &coord.LoggedRequest{ReqID: c.reqID, Frontend: f.name, Deadline: deadline, Request: req}
	lctx, lcancel := context.WithTimeout(ctx, logAttemptTimeout)
	existing, err := f.cfg.Log.LogRequest(lctx, lr)
	lcancel()
	f.m.logLatency.Observe(time.Since(t0).Seconds())
	if err != nil {
		// Under one hold of mu: the consumer's delivery (onLogged) is
		// either seen here or finds the request's id unconfirmed.
		f.mu.Lock()
		switch {
		case c.injected:
			// The log consumer delivered the record (so it is stored)
			// and this frontend, leading, injected it: only the
			// acknowledgement was lost.
			f.mu.Unlock()
			return f.wait(ctx, c)
		case c.logDelivered:
			// The log consumer delivered the record and left it to this
			// call: only the acknowledgement was lost. Go on as if it
			// had come (the record's sequence is the delivery's).
			lr.Seq = c.logSeq
			f.mu.Unlock()
			f.log.Info("request log write failed after its record was delivered; the request goes on", "service", svc.name, "req_id", c.reqID, "seq", lr.Seq, "err", err)
		default:
			err = status.Errorf(codes.Unavailable, "service %q: request not accepted: request log: %v", svc.name, err)
			// The record may be stored after all (the NATS client flushes
			// its reconnect buffer once the server is back, or the server
			// stored it and died before acknowledging): the client's retry
			// then joins it, on any frontend, and waits for the leader to
			// inject it. This process's own req_id must not make the
			// record look like one of its calls that is over (onLogged,
			// adopt).
			f.mir.writeFailed(c.reqID, deadline, f.now())
			f.answerLocked(c, nil, err, false, false)
			f.mu.Unlock()
			return nil, err
		}
	}
	if existing != nil && existing.ReqID != c.reqID {
		return f.joinLogged(ctx, c, existing)
	}
	f.m.logged.Inc()
	f.log.Debug("request logged", "service", svc.name, "req_id", c.reqID, "request_id", req.GetRequestId(), "seq", lr.Seq)
	f.mu.Lock()
	switch {
	case f.closed || !f.leader || c.injected || f.calls[c.reqID] != c:
		f.mu.Unlock()
	case leading && f.leadTerm == term:
		if lr.Seq != 0 && (f.leadFence == 0 || lr.Seq < f.leadFence) {
			f.leadFence = lr.Seq
		}
		f.injectLocked(c, svc)
		f.mu.Unlock()
	default:
		// Logged while following, acknowledged after this frontend took
		// over: the previous leader may have injected and answered it
		// with the record still on its way here.
		now := f.leadTerm
		f.mu.Unlock()
		if f.unanswered(ctx, lr) {
			f.adopt(lr, now)
		}
	}
	return f.wait(ctx, c)
}

// joinLogged makes call c (not logged: its key was taken) an attempt of
// the logged request existing: c takes existing's req_id, or joins the
// call this frontend has for it, and its answer is looked up in case it is
// recorded already. A leader injects it when the look-up, begun while it
// led, finds no answer: a client retrying the request of a dead leader on
// the new one would otherwise wait until the log consumer delivered the
// record (a lone frontend restarted in place: at the end of its backlog).
func (f *Frontend) joinLogged(ctx context.Context, c *call, existing *coord.LoggedRequest) (*hamsv1.PredictResponse, error) {
	f.mu.Lock()
	delete(f.calls, c.reqID)
	target := f.calls[existing.ReqID]
	if target == nil {
		c.reqID, c.req, c.deadline = existing.ReqID, existing.Request, existing.Deadline
		f.calls[c.reqID] = c
		target = c
	} else {
		// c's joiners wait on c: answer them with target's answer.
		target.waiters += c.waiters
		target.linked = append(target.linked, c)
		if c.hasKey && f.inflight[c.key] == c {
			f.inflight[c.key] = target
		}
	}
	term := f.leadTerm // before the look-up: adopt injects only if it still leads in term
	f.mu.Unlock()
	f.log.Debug("request joins an attempt logged before", "req_id", existing.ReqID, "logged_by", existing.Frontend)
	if f.unanswered(ctx, existing) {
		f.adopt(existing, term)
	}
	return f.wait(ctx, c)
}

// onReplyRecord applies an answer recorded by any frontend: a call of
// this frontend waiting for that request gets it (and leaves the table or
// the hold area), injected or not (an injected call whose record comes
// from elsewhere is answered with that record: the takeover rule's
// backstop), and the log mirror forgets the request. A call whose own
// answer is being recorded ignores it: the recorder learns the winner.
func (f *Frontend) onReplyRecord(r *coord.LoggedReply) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mir.answer(r.ReqID, f.now())
	c := f.calls[r.ReqID]
	if c == nil || c.recording {
		return
	}
	f.table.remove(r.ReqID)
	if f.holds != nil {
		f.holds.drop(r.ReqID)
	}
	resp, err := answerOf(r)
	f.answerLocked(c, resp, err, true, false)
}

func answerOf(r *coord.LoggedReply) (*hamsv1.PredictResponse, error) {
	if r.Code != codes.OK {
		return nil, status.Error(r.Code, r.Error)
	}
	return r.Response, nil
}

// recordLocked queues an answer to be recorded before it is released.
func (f *Frontend) recordLocked(c *call, resp *hamsv1.PredictResponse, err error) {
	if c.recording {
		return
	}
	c.recording = true
	f.recQ = append(f.recQ, recording{c: c, resp: resp, err: err})
	signal(f.recKick)
}

// recorderLoop records queued answers (at most recordWorkers at a time)
// until ctx ends; what is queued then is answered by shutdown.
func (f *Frontend) recorderLoop(ctx context.Context) {
	sem := make(chan struct{}, recordWorkers)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.recKick:
		}
		f.mu.Lock()
		q := f.recQ
		f.recQ = nil
		f.mu.Unlock()
		for _, r := range q {
			if !goBounded(ctx, sem, &wg, func() { f.recordOne(ctx, r) }) {
				return
			}
		}
	}
}

// recordOne records one answer (retrying until the request's deadline
// plus recordGrace) and then releases it: this frontend's answer when its
// record won, the recorded one when another frontend's did.
func (f *Frontend) recordOne(ctx context.Context, r recording) {
	rec := &coord.LoggedReply{ReqID: r.c.reqID, Frontend: f.name, Response: r.resp}
	if r.err != nil {
		st := status.Convert(r.err)
		rec.Response, rec.Code, rec.Error = nil, st.Code(), st.Message()
	}
	// The audit record is written before the answer is recorded: other
	// frontends see a record as NATS routes it, before this one even has
	// JetStream's acknowledgement, and may release it to their clients at
	// once; this frontend may die meanwhile (docs/recovery.md).
	audited := false
	if f.auditLog != nil && r.err == nil && r.resp != nil {
		f.auditNow(r.resp)
		audited = true
	}
	giveUp := r.c.deadline.Add(recordGrace)
	backoff := minBackoff
	for {
		existing, err := f.cfg.Log.RecordReply(ctx, rec)
		if err == nil {
			f.mu.Lock()
			r.c.audited = audited
			if existing == nil {
				f.m.recorded.WithLabelValues("own").Inc()
				f.answerLocked(r.c, r.resp, r.err, true, true)
			} else {
				f.m.recorded.WithLabelValues("other").Inc()
				resp, aerr := answerOf(existing)
				if audited && (aerr != nil || auditReply(resp).ReplyDigest != auditReply(r.resp).ReplyDigest ||
					resp.GetApproximate() != r.resp.GetApproximate()) {
					// Two frontends injected the request and computed
					// different answers; the checker will see both.
					f.log.Error("another frontend recorded a different answer than the one audited here", "req_id", r.c.reqID, "recorded_by", existing.Frontend)
				}
				f.answerLocked(r.c, resp, aerr, true, false)
			}
			f.mu.Unlock()
			return
		}
		f.m.recorded.WithLabelValues("error").Inc()
		if ctx.Err() != nil || !f.now().Before(giveUp) {
			f.mu.Lock()
			f.answerLocked(r.c, nil, status.Errorf(codes.Unavailable, "request %d: answer could not be recorded: %v", r.c.reqID, err), false, true)
			f.mu.Unlock()
			return
		}
		f.log.Warn("record answer; retrying", "req_id", r.c.reqID, "err", err, "backoff", backoff)
		if !run.Sleep(ctx, backoff) {
			continue
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// resendSinks asks every sink model to resend to this frontend the items
// it keeps for the frontend edge (acknowledged by the previous leader but
// not completed): the requests this frontend takes over need them. The
// sinks are asked all at once (each call dials its sink: a handshake per
// sink). Failures are logged; the requests then complete from
// re-execution or expire.
func (f *Frontend) resendSinks(ctx context.Context) {
	done := map[string]bool{}
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, n := range f.svcOrder {
		for _, sink := range f.services[n].sinks {
			if done[sink] {
				continue
			}
			done[sink] = true
			wg.Add(1)
			go func() {
				defer wg.Done()
				f.resendSink(ctx, sink)
			}()
		}
	}
}

// resendSink asks one sink model for its resend (see resendSinks), until
// it is done, this frontend stops leading (ctx), or a request timeout has
// passed (what the sink keeps for the frontend is then past every
// deadline). A sink without an address at the takeover (its instance is
// being replaced) or whose call fails is asked again with backoff: a
// resend skipped for good left the sink's sender numbering the edge from
// where it stood at the previous leader, and its items before that, acked
// there and maybe never answered, with nobody to ask for them.
func (f *Frontend) resendSink(ctx context.Context, sink string) {
	giveUp := time.Now().Add(f.timeout)
	backoff := minBackoff
	for attempt := 1; ; attempt++ {
		err := f.resendSinkOnce(ctx, sink)
		if err == nil || ctx.Err() != nil {
			return
		}
		if c := status.Code(errors.Unwrap(err)); c == codes.Unimplemented || c == codes.NotFound || c == codes.InvalidArgument {
			// The instance answered: it will not resend, asked again or not.
			f.log.Warn("sink resend refused", "model", sink, "err", err)
			return
		}
		if !time.Now().Add(backoff).Before(giveUp) {
			f.log.Warn("sink resend not done; giving up", "model", sink, "attempts", attempt, "err", err)
			return
		}
		f.log.Info("sink resend not done; retrying", "model", sink, "attempt", attempt, "err", err, "backoff", backoff)
		if !run.Sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// errSinkUnresolved: the topology names no instance of a sink model.
var errSinkUnresolved = errors.New("frontend: sink model has no address in the topology")

// resendSinkOnce asks the sink model's current instance once.
func (f *Frontend) resendSinkOnce(ctx context.Context, sink string) error {
	addr, _, ok := f.cfg.Resolver.Resolve(sink)
	if !ok {
		return errSinkUnresolved
	}
	_, ep, _ := f.cfg.Resolver.Resolve(config.Frontend)
	cc, err := grpcx.Dial(addr, f.maxBytes, f.cfg.DialOptions...)
	if err != nil {
		return fmt.Errorf("dial %s at %s: %w", sink, addr, err)
	}
	defer cc.Close()
	cctx, cancel := context.WithTimeout(ctx, sinkResendTimeout)
	defer cancel()
	resp, err := hamsv1.NewReplicationClient(cc).Resend(cctx, &hamsv1.ResendRequest{
		ToModel: config.Frontend, ToAddress: f.cfg.Address, AfterEdgeSeq: 0, Epoch: ep})
	if err != nil {
		return fmt.Errorf("resend of %s at %s: %w", sink, addr, err)
	}
	f.log.Info("sink resend", "model", sink, "addr", addr, "resent", resp.GetResent())
	return nil
}

// logMirror is a frontend's view of the request log's open entries: the
// logged requests whose answer it has not seen. Every frontend keeps one
// while it follows, fed by its request-log consumer and its reply watch,
// so that when the topology makes it the leader it knows the previous
// leader's open requests at once instead of scanning the log back a
// request timeout (docs/recovery.md, "Frontend and manager failover").
// It is a pure state machine: records and answers in, the requests to
// look up at a takeover out; no I/O, the caller's clock, and the caller's
// lock (the frontend's mu, so the switch to leading and the arrival of a
// record are ordered).
//
// What it knows is one-sided: an answer it saw is recorded (a reply
// record exists), but a request it holds open may be answered with the
// record still on its way (the reply watch lags, and may miss records),
// so its open requests are candidates to look up, never a verdict
// (the takeover rule, above).
//
// Invariants: a req_id is never both pending and answered; pending holds
// only requests whose deadline had not passed when they arrived; order
// lists every pending req_id once, in arrival (log) order, possibly among
// ids that left pending since; an answer is remembered for keep (a record
// that arrives after its answer, from a lagging or restarted consumer, is
// dropped) and at most maxAnswered answers are remembered.
type logMirror struct {
	keep        time.Duration
	maxAnswered int
	pending     map[uint64]*coord.LoggedRequest
	order       []uint64
	answered    map[uint64]bool
	answeredQ   []answeredAt // answered ids, oldest first
	// unconfirmed: this process's req_ids whose log write failed, until
	// their deadline: a record of one delivered later is a request
	// like another frontend's (writeFailed).
	unconfirmed        map[uint64]time.Time
	unconfirmedSweepAt int // size at which writeFailed next drops expired ids
}

type answeredAt struct {
	id uint64
	at time.Time
}

// mirrorMaxAnswered bounds the answers a mirror remembers.
const mirrorMaxAnswered = 1 << 18

func newLogMirror(keep time.Duration) *logMirror {
	return &logMirror{keep: keep, maxAnswered: mirrorMaxAnswered,
		pending: map[uint64]*coord.LoggedRequest{}, answered: map[uint64]bool{}, unconfirmed: map[uint64]time.Time{}}
}

// writeFailed records that the log write of this process's request reqID
// failed, so its record may still be stored (until deadline); the ids
// whose deadline passed are dropped.
func (m *logMirror) writeFailed(reqID uint64, deadline, now time.Time) {
	if m == nil {
		return
	}
	// Expired ids are dropped when the map has doubled since the last
	// sweep: during a NATS outage every request fails its write, and a
	// sweep per failure would cost the square of them.
	if len(m.unconfirmed) >= m.unconfirmedSweepAt {
		for id, d := range m.unconfirmed {
			if !now.Before(d) {
				delete(m.unconfirmed, id)
			}
		}
		m.unconfirmedSweepAt = max(64, 2*len(m.unconfirmed))
	}
	m.unconfirmed[reqID] = deadline
}

// mayBeLogged reports whether reqID is this process's request whose log
// write failed and whose deadline has not passed.
func (m *logMirror) mayBeLogged(reqID uint64, now time.Time) bool {
	if m == nil {
		return false
	}
	d, ok := m.unconfirmed[reqID]
	return ok && now.Before(d)
}

// logged records a logged request. It reports whether the request is open
// (kept for a takeover).
func (m *logMirror) logged(r *coord.LoggedRequest, now time.Time) bool {
	if m == nil {
		return false
	}
	m.forget(now)
	if m.answered[r.ReqID] || !now.Before(r.Deadline) {
		return false
	}
	if _, ok := m.pending[r.ReqID]; !ok {
		m.order = append(m.order, r.ReqID)
	}
	m.pending[r.ReqID] = r
	if len(m.order) > 2*len(m.pending)+1024 {
		m.compact(now)
	}
	return true
}

// answer records that reqID's answer is recorded (or released).
func (m *logMirror) answer(reqID uint64, now time.Time) {
	if m == nil {
		return
	}
	m.forget(now)
	delete(m.pending, reqID)
	if m.answered[reqID] {
		return
	}
	m.answered[reqID] = true
	m.answeredQ = append(m.answeredQ, answeredAt{id: reqID, at: now})
	if len(m.answeredQ) > m.maxAnswered {
		delete(m.answered, m.answeredQ[0].id)
		m.answeredQ = m.answeredQ[1:]
	}
}

// isAnswered reports whether reqID's answer was seen (and not forgotten).
func (m *logMirror) isAnswered(reqID uint64) bool {
	return m != nil && m.answered[reqID]
}

// take returns the open requests whose deadline has not passed, in log
// order, and empties the pending set (the caller now leads: it looks them
// up and injects the unanswered ones; the records that arrive later are
// its to check and inject). Answers are kept.
func (m *logMirror) take(now time.Time) []*coord.LoggedRequest {
	if m == nil {
		return nil
	}
	var out []*coord.LoggedRequest
	for _, id := range m.order {
		if r, ok := m.pending[id]; ok && now.Before(r.Deadline) {
			out = append(out, r)
			delete(m.pending, id)
		}
	}
	clear(m.pending)
	m.order = m.order[:0]
	return out
}

// open is the number of pending requests.
func (m *logMirror) open() int { return len(m.pending) }

// forget drops the answers remembered longer than keep.
func (m *logMirror) forget(now time.Time) {
	n := 0
	for n < len(m.answeredQ) && now.Sub(m.answeredQ[n].at) > m.keep {
		delete(m.answered, m.answeredQ[n].id)
		n++
	}
	if n > 0 {
		m.answeredQ = append(m.answeredQ[:0:0], m.answeredQ[n:]...)
	}
}

// compact drops the pending requests past their deadline and rebuilds
// order from what is left.
func (m *logMirror) compact(now time.Time) {
	order := make([]uint64, 0, len(m.pending))
	for _, id := range m.order {
		r, ok := m.pending[id]
		if !ok {
			continue
		}
		if !now.Before(r.Deadline) {
			delete(m.pending, id)
			continue
		}
		order = append(order, id)
	}
	m.order = order
}
