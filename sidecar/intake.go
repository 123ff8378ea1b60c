package sidecar

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/sidecar/datapath"
)

// intake is the front of a serving sidecar's request path: the inbox the
// Receiver delivers to (Sidecar.deliver), and the loop that drains it
// into a Joiner (fan-in) and a Batcher and hands batches to the
// executors.
//
// Invariants: joiner and batcher are owned by the loop goroutine while a
// serving stage runs; reset replaces them only while no stage runs (a role
// transition).
type intake struct {
	inbox   chan *hamsv1.Item
	model   *config.Model
	preds   []string
	out     *outEdges
	metrics *metrics
	log     *slog.Logger

	joiner  *datapath.Joiner
	batcher *datapath.Batcher[*datapath.Joined]
}

// newIntake builds the intake of model m, whose predecessors are preds
// (Graph.Pred order).
func newIntake(m *config.Model, preds []string, out *outEdges, mt *metrics, log *slog.Logger) (*intake, error) {
	in := &intake{inbox: make(chan *hamsv1.Item, inboxSize), model: m, preds: preds, out: out, metrics: mt, log: log}
	if err := in.fresh(); err != nil {
		return nil, err
	}
	return in, nil
}

// fresh starts an empty Joiner and Batcher.
func (in *intake) fresh() error {
	j, err := datapath.NewJoiner(in.preds, in.model.FanIn, maxWaitingJoin)
	if err != nil {
		return err
	}
	if !in.model.Stateful {
		// A stateless join re-forms a request when a superseding part
		// arrives after an upstream stateful failover (Joiner.RememberJoined).
		j.RememberJoined(maxWaitingJoin)
	}
	in.joiner = j
	in.batcher = datapath.NewBatcher[*datapath.Joined](in.model.Batch.Size, in.model.Batch.MaxWait.D())
	return nil
}

// reset forgets the requests not yet executed, the inbox's included: they
// come again by resends (caller stopped the stage).
func (in *intake) reset() {
	_ = in.fresh() // the same preds and fan-in newIntake accepted
	for {
		select {
		case <-in.inbox:
			continue
		default:
		}
		return
	}
}

// loop owns the Joiner and Batcher: it accepts items, forms requests, and
// hands a batch to an executor whenever one is idle and no out-edge is
// over its backlog bound.
func (in *intake) loop(ctx context.Context, work chan<- []*datapath.Joined, idle <-chan struct{}) {
	idleN := 0 // executors waiting for work (none until the backend is described)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := in.out.now()
		for _, j := range in.joiner.Expire(now) {
			in.out.fail(j, codes.DeadlineExceeded, "deadline exceeded waiting for all branches")
		}
		blocked := false
		if idleN > 0 && in.batcher.Len() > 0 {
			if blocked = in.out.full(); !blocked {
				if b := in.batcher.Ready(now); b != nil {
					select {
					case work <- b:
						idleN--
					case <-ctx.Done():
						return
					}
				}
			}
		}
		in.metrics.queue.Set(float64(in.batcher.Len() + in.joiner.Waiting()))
		var wake time.Time
		if idleN > 0 && !blocked {
			wake = in.batcher.NextDeadline()
		}
		if blocked {
			wake = now.Add(time.Millisecond)
		}
		if d := in.joiner.NextDeadline(); !d.IsZero() && (wake.IsZero() || d.Before(wake)) {
			wake = d
		}
		if !wake.IsZero() {
			timer.Reset(max(wake.Sub(now), 0))
		} else {
			timer.Stop()
		}
		select {
		case it := <-in.inbox:
			in.accept(it, now)
			// Take what else is queued before batching (amortizes wakeups).
			for n := 0; n < 256; n++ {
				select {
				case it := <-in.inbox:
					in.accept(it, in.out.now())
					continue
				default:
				}
				break
			}
		case <-idle:
			idleN++
		case <-timer.C:
		case <-ctx.Done():
			return
		}
	}
}

// accept runs one inbound item through the Joiner.
func (in *intake) accept(it *hamsv1.Item, now time.Time) {
	in.metrics.itemsIn.Inc()
	j, evicted, err := in.joiner.Add(it)
	for _, e := range evicted {
		in.out.fail(e, codes.ResourceExhausted, "too many incomplete joins")
	}
	if err != nil {
		reason := "unknown_pred"
		switch {
		case errors.Is(err, datapath.ErrLatePart):
			reason = "late_part"
		case errors.Is(err, datapath.ErrDupPart):
			reason = "dup_part"
		}
		in.metrics.dropped.WithLabelValues(reason).Inc()
		in.log.Warn("dropping inbound item", "req_id", it.GetReqId(), "from", it.GetFromModel(), "err", err)
		return
	}
	if j == nil {
		return
	}
	if hasError(j) {
		in.out.passError(j)
		return
	}
	if j.Deadline != 0 && now.UnixNano() >= j.Deadline {
		in.out.fail(j, codes.DeadlineExceeded, "deadline exceeded before execution")
		return
	}
	in.batcher.Add(j, now)
}

func hasError(j *datapath.Joined) bool {
	for _, p := range j.Parts {
		if p != nil && (p.GetError() != "" || p.GetErrorCode() != 0) {
			return true
		}
	}
	return false
}
