// Package grpcretry retries the idempotent unary calls of a model server
// adapter on Unavailable (a server restarting, a connection being
// re-established), with the go-grpc-middleware v2 retry interceptor.
//
// The adapters name the methods that may be retried; every other call
// (ModelInfer, Predict, Compute, Update, a shared-memory Register: calls
// that change state or are not idempotent) passes through once, whichever
// client stub makes it, and so do streams. The sidecar owns the recovery
// of those.
package grpcretry

import (
	"context"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// DefaultAttempts is the number of attempts of an idempotent call when an
// adapter is given none.
const DefaultAttempts = 3

// Backoff before the first retry; it doubles per attempt, with 20% jitter.
const Backoff = 20 * time.Millisecond

// Idempotent wraps cc so that unary calls of the named methods (full
// names, "/package.Service/Method") are made up to attempts times while
// they answer Unavailable; attempts <= 1 makes them once. The caller's
// context bounds all attempts together.
func Idempotent(cc grpc.ClientConnInterface, attempts int, methods ...string) grpc.ClientConnInterface {
	set := make(map[string]bool, len(methods))
	for _, m := range methods {
		set[m] = true
	}
	return &conn{cc: cc, methods: set, icpt: retry.UnaryClientInterceptor(
		retry.WithMax(uint(max(attempts, 1))),
		retry.WithCodes(codes.Unavailable),
		retry.WithBackoff(retry.BackoffExponentialWithJitter(Backoff, 0.2)),
	)}
}

type conn struct {
	cc      grpc.ClientConnInterface
	methods map[string]bool
	icpt    grpc.UnaryClientInterceptor
}

func (c *conn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if !c.methods[method] {
		return c.cc.Invoke(ctx, method, args, reply, opts...)
	}
	return c.icpt(ctx, method, args, reply, nil, func(ctx context.Context, method string, req, reply any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
		return c.cc.Invoke(ctx, method, req, reply, opts...)
	}, opts...)
}

func (c *conn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.cc.NewStream(ctx, desc, method, opts...)
}
