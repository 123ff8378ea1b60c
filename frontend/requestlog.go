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
	WatchRequests(ctx context.Context, since time.Time, fn func(r *coord.LoggedRequest, backlog bool)) error
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
	// scans beyond the request timeout (clock skew between frontends).
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
// watcher (answers recorded by other frontends), the recorder (this
// frontend's answers, recorded before release) and the leadership loop.
func (f *Frontend) runLog(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(4)
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

// leadershipLoop follows the topology: the frontend the Resolver names for
// config.Frontend receives every sink edge, so it is the one frontend that
// injects requests (two frontends sending on frontend -> entry edges would
// fence each other off at the entry models' receivers). While leading, it
// consumes the request log (the other frontends' requests, and on taking
// over the unanswered requests of the previous leader) and asks the sink
// models to resend what they keep for the frontend.
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
			f.mu.Lock()
			f.leader = true
			// Entry receivers follow the newest sender incarnation of the
			// frontend edge: start a new one on every entry edge, or a
			// frontend created before the previous leader would be refused
			// as stale (nothing is resent: After is the largest position).
			for _, snd := range f.senders {
				snd.Resend(edge.ResendSpec{After: ^uint64(0)})
			}
			f.mu.Unlock()
			since := f.now().Add(-f.timeout - takeoverSlack)
			f.log.Info("frontend leads: injecting logged requests", "since", since)
			lctx, cancel := context.WithCancel(ctx)
			cancelLead = cancel
			leadWG.Add(2)
			go func() { defer leadWG.Done(); f.consumeLog(lctx, since) }()
			go func() { defer leadWG.Done(); f.resendSinks(lctx) }()
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

// consumeLog injects logged requests until ctx ends, restarting the watch
// with backoff (a restart replays from since; injected requests are
// skipped).
func (f *Frontend) consumeLog(ctx context.Context, since time.Time) {
	backoff := minBackoff
	for {
		err := f.cfg.Log.WatchRequests(ctx, since, func(r *coord.LoggedRequest, backlog bool) { f.onLogged(ctx, r, backlog) })
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

// ownReqID reports whether reqID was handed out by this process.
func (f *Frontend) ownReqID(reqID uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	shift := 64 - coord.IncarnationBits
	return reqID>>shift == f.table.next>>shift
}

// onLogged handles one logged request while leading: it injects it unless
// it is injected already, answered, or past its deadline. Requests this
// process logged after it began to lead were injected by predict; a
// backlog record (logged before) is first looked up among the recorded
// answers, since the previous leader may have answered it.
func (f *Frontend) onLogged(ctx context.Context, r *coord.LoggedRequest, backlog bool) {
	if !f.now().Before(r.Deadline) {
		return
	}
	svc := f.services[r.Request.GetService()]
	if svc == nil {
		f.log.Warn("logged request names an unknown service; skipped", "req_id", r.ReqID, "service", r.Request.GetService())
		return
	}
	own := f.ownReqID(r.ReqID)
	f.mu.Lock()
	c := f.calls[r.ReqID]
	skip := f.closed || (c != nil && (c.injected || c.recording)) || (own && (!backlog || c == nil))
	f.mu.Unlock()
	if skip {
		return
	}
	// A record is checked as predict checks a client's request: the log
	// is outside bytes too (another frontend's view of the deployment,
	// or a record nobody's frontend wrote). A refused one is answered
	// with the refusal, recorded like any answer, so a frontend waiting
	// for it answers its client.
	refused := f.checkLogged(svc, r.Request)
	if refused != nil {
		f.log.Warn("logged request refused", "req_id", r.ReqID, "logged_by", r.Frontend, "err", refused)
	}
	if backlog && refused == nil {
		rec, err := f.cfg.Log.LookupReply(ctx, r.ReqID)
		if err == nil {
			f.onReplyRecord(rec)
			return
		}
		if !errors.Is(err, coord.ErrNoRecord) {
			f.log.Warn("look up answer of a logged request; injecting it", "req_id", r.ReqID, "err", err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || !f.leader {
		return
	}
	c = f.calls[r.ReqID]
	if c == nil {
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
	} else if c.injected || c.recording {
		return
	}
	c.req, c.deadline = r.Request, r.Deadline
	if refused != nil {
		c.injected = true // this frontend answers it, so it records the answer
		f.finishLocked(c, nil, refused, true)
		return
	}
	if !own {
		f.m.adopted.Inc()
	}
	f.log.Debug("logged request injected", "req_id", r.ReqID, "logged_by", r.Frontend, "backlog", backlog)
	f.injectLocked(c, svc)
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
// frontend) joins that attempt. The leader injects the request itself;
// another frontend waits for the answer the leader records.
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
	f.mu.Unlock()

	t0 := time.Now()
	// One attempt: a log write in flight when NATS dies never gets its
	// acknowledgement, so it is bounded well inside the client's deadline;
	// the client's retry (same request_id, on any frontend) finds the
	// record if it was written after all.
	lctx, lcancel := context.WithTimeout(ctx, logAttemptTimeout)
	existing, err := f.cfg.Log.LogRequest(lctx, &coord.LoggedRequest{ReqID: c.reqID, Frontend: f.name, Deadline: deadline, Request: req})
	lcancel()
	f.m.logLatency.Observe(time.Since(t0).Seconds())
	if err != nil {
		err = status.Errorf(codes.Unavailable, "service %q: request not accepted: request log: %v", svc.name, err)
		f.mu.Lock()
		f.answerLocked(c, nil, err, false, false)
		f.mu.Unlock()
		return nil, err
	}
	if existing != nil && existing.ReqID != c.reqID {
		return f.joinLogged(ctx, c, existing)
	}
	f.m.logged.Inc()
	f.mu.Lock()
	if f.leader && !f.closed && !c.injected && f.calls[c.reqID] == c {
		f.injectLocked(c, svc)
	}
	f.mu.Unlock()
	f.log.Debug("request logged", "service", svc.name, "req_id", c.reqID, "request_id", req.GetRequestId())
	return f.wait(ctx, c)
}

// joinLogged makes call c (not logged: its key was taken) an attempt of
// the logged request existing: c takes existing's req_id, or joins the
// call this frontend has for it, and its answer is looked up in case it is
// recorded already.
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
	f.mu.Unlock()
	f.log.Debug("request joins an attempt logged before", "req_id", existing.ReqID, "logged_by", existing.Frontend)
	if rec, err := f.cfg.Log.LookupReply(ctx, existing.ReqID); err == nil {
		f.onReplyRecord(rec)
	}
	return f.wait(ctx, c)
}

// onReplyRecord applies an answer recorded by any frontend: a call of
// this frontend waiting for that request gets it (and leaves the table or
// the hold area). A call whose own answer is being recorded ignores it:
// the recorder learns the winner.
func (f *Frontend) onReplyRecord(r *coord.LoggedReply) {
	f.mu.Lock()
	defer f.mu.Unlock()
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
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				f.recordOne(ctx, r)
			}()
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
// not completed): the requests this frontend takes over need them.
// Failures are logged; the requests then complete from re-execution or
// expire.
func (f *Frontend) resendSinks(ctx context.Context) {
	done := map[string]bool{}
	for _, n := range f.svcOrder {
		for _, sink := range f.services[n].sinks {
			if done[sink] {
				continue
			}
			done[sink] = true
			addr, _, ok := f.cfg.Resolver.Resolve(sink)
			if !ok {
				continue
			}
			_, ep, _ := f.cfg.Resolver.Resolve(config.Frontend)
			cc, err := grpcx.Dial(addr, f.maxBytes, f.cfg.DialOptions...)
			if err != nil {
				f.log.Warn("sink resend: dial", "model", sink, "addr", addr, "err", err)
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, sinkResendTimeout)
			resp, err := hamsv1.NewReplicationClient(cc).Resend(cctx, &hamsv1.ResendRequest{
				ToModel: config.Frontend, ToAddress: f.cfg.Address, AfterEdgeSeq: 0, Epoch: ep})
			cancel()
			_ = cc.Close()
			if err != nil {
				f.log.Info("sink resend not done", "model", sink, "addr", addr, "err", err)
				continue
			}
			f.log.Info("sink resend", "model", sink, "resent", resp.GetResent())
		}
	}
}
