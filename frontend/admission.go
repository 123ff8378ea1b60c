package frontend

import (
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Admission control (limits.max_inflight_requests, max_inflight_bytes):
// the frontend works on a bounded number of client requests and request
// bytes at once. A request that would take either past its bound is
// answered ResourceExhausted at once, before it is checked for
// non-finite values, logged or sent into the graph, so a burst of huge
// requests cannot make every client wait behind them (or make the
// frontend hold their tensors until it runs out of memory). An HTTP
// request is admitted on its body's size before the body is read
// (http.go); a gRPC or compatibility request on its decoded tensors.

// admission counts the work in flight. A nil *admission admits
// everything.
type admission struct {
	mu       sync.Mutex
	reqs     int
	bytes    int64
	maxReqs  int
	maxBytes int64
}

func newAdmission(maxReqs int, maxBytes int64) *admission {
	return &admission{maxReqs: maxReqs, maxBytes: maxBytes}
}

// acquire admits one request of n bytes, or says why not (a
// ResourceExhausted status naming the bound). release gives the room
// back (once).
func (a *admission) acquire(service string, n int64) (release func(), err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.maxReqs > 0 && a.reqs+1 > a.maxReqs:
		return nil, status.Errorf(codes.ResourceExhausted, "service %q: frontend busy: %d requests in flight, the limit is %d (limits.max_inflight_requests); retry later",
			service, a.reqs, a.maxReqs)
	case a.maxBytes > 0 && a.bytes+n > a.maxBytes:
		return nil, status.Errorf(codes.ResourceExhausted, "service %q: frontend busy: a request of %d bytes with %d bytes in flight exceeds the limit of %d bytes (limits.max_inflight_bytes); retry later",
			service, n, a.bytes, a.maxBytes)
	}
	a.reqs++
	a.bytes += n
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			a.reqs--
			a.bytes -= n
			a.mu.Unlock()
		})
	}, nil
}

// load is the requests and bytes in flight.
func (a *admission) load() (int, int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reqs, a.bytes
}

// requestBytes is what a request counts against max_inflight_bytes: its
// tensors' data.
func requestBytes(req *hamsv1.PredictRequest) int64 {
	var n int64
	for _, t := range req.GetInputs() {
		n += int64(len(t.GetData()))
	}
	return n
}
