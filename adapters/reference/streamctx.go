package reference

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errStreamIdle is the cause of a state stream's context when no chunk
// moved for the adapter's timeout.
var errStreamIdle = errors.New("reference: state stream idle")

// streamCtx bounds a state stream (ReadState, WriteState) by the time
// between two chunks, not by the whole transfer: a state of hundreds of MB
// on a busy host takes longer than the per-call timeout to stream, and a
// bound on the total failed every read of a 512 MiB state, for good (the
// sidecar stopped, was restarted and timed out again; issue 22's
// state-size sweep). progress restarts the idle clock; stop releases the
// context. Without a timeout only the caller's context bounds it.
func (b *Backend) streamCtx(ctx context.Context) (sctx context.Context, progress func(), stop func()) {
	sctx, cancel := context.WithCancelCause(ctx)
	if b.timeout <= 0 {
		return sctx, func() {}, func() { cancel(nil) }
	}
	idle := time.AfterFunc(b.timeout, func() { cancel(errStreamIdle) })
	return sctx, func() { idle.Reset(b.timeout) }, func() { idle.Stop(); cancel(nil) }
}

// streamErr maps the error of a state stream op whose context sctx may
// have been ended for idleness to DeadlineExceeded naming the idle bound.
func (b *Backend) streamErr(sctx context.Context, op string, err error) error {
	if err != nil && errors.Is(context.Cause(sctx), errStreamIdle) {
		return status.Errorf(codes.DeadlineExceeded, "reference %s %s: no chunk moved for %v: %v", b.model, op, b.timeout, err)
	}
	return b.mapErr(op, err)
}
