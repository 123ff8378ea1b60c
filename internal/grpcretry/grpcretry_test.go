package grpcretry

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// flaky answers the first fails calls of each method with code, then OK.
type flaky struct {
	fails int
	code  codes.Code
	calls map[string]int
}

func (f *flaky) Invoke(_ context.Context, method string, _, _ any, _ ...grpc.CallOption) error {
	f.calls[method]++
	if f.calls[method] <= f.fails {
		return status.Errorf(f.code, "attempt %d", f.calls[method])
	}
	return nil
}

func (f *flaky) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	f.calls["stream"]++
	return nil, status.Error(codes.Unavailable, "no stream")
}

func TestOnlyNamedMethodsRetried(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		what     string
		attempts int
		fails    int
		code     codes.Code
		method   string
		want     codes.Code
		calls    int
	}{
		{"named, recovers", 3, 2, codes.Unavailable, "/s/Idem", codes.OK, 3},
		{"named, exhausted", 3, 5, codes.Unavailable, "/s/Idem", codes.Unavailable, 3},
		{"named, attempts 1", 1, 5, codes.Unavailable, "/s/Idem", codes.Unavailable, 1},
		{"named, attempts 0", 0, 5, codes.Unavailable, "/s/Idem", codes.Unavailable, 1},
		{"named, other code", 3, 5, codes.InvalidArgument, "/s/Idem", codes.InvalidArgument, 1},
		{"not named", 3, 5, codes.Unavailable, "/s/Infer", codes.Unavailable, 1},
	} {
		f := &flaky{fails: tc.fails, code: tc.code, calls: map[string]int{}}
		cc := Idempotent(f, tc.attempts, "/s/Idem", "/s/Other")
		err := cc.Invoke(ctx, tc.method, nil, nil)
		if status.Code(err) != tc.want || f.calls[tc.method] != tc.calls {
			t.Errorf("%s: %v after %d calls, want %v after %d", tc.what, err, f.calls[tc.method], tc.want, tc.calls)
		}
	}
	f := &flaky{calls: map[string]int{}}
	if _, err := Idempotent(f, 3, "/s/Idem").NewStream(ctx, &grpc.StreamDesc{}, "/s/Idem"); status.Code(err) != codes.Unavailable || f.calls["stream"] != 1 {
		t.Errorf("stream: %v after %d calls, want one unretried call", err, f.calls["stream"])
	}
}

// TestContextBoundsRetries: the caller's deadline ends the retries.
func TestContextBoundsRetries(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), Backoff/2)
	defer cancel()
	f := &flaky{fails: 100, code: codes.Unavailable, calls: map[string]int{}}
	err := Idempotent(f, 100, "/s/Idem").Invoke(ctx, "/s/Idem", nil, nil)
	if err == nil || f.calls["/s/Idem"] >= 100 {
		t.Fatalf("%v after %d calls", err, f.calls["/s/Idem"])
	}
}
