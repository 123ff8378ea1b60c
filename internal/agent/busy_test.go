package agent

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// An agent busy with other starts (429) is asked again until it takes the
// start: a start given up on left a model without a backup for good
// after a partition healed and the manager asked for many at once.
func TestClientRetriesBusyAgent(t *testing.T) {
	var calls atomic.Int32
	var busyFor atomic.Int32
	busyFor.Store(2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) <= busyFor.Load() {
			http.Error(w, "instance agent: 4 starts already in progress", http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	c, err := NewClient(srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.StartInstance(ctx, "m", hamsv1.Role_ROLE_BACKUP); err != nil {
		t.Fatalf("start after the agent was busy twice: %v", err)
	}
	if got := calls.Load(); got != 3 {
		t.Fatalf("agent asked %d times, want 3", got)
	}

	// Busy until the caller gives up: the error says so.
	busyFor.Store(1 << 30)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if err := c.StartInstance(ctx2, "m", hamsv1.Role_ROLE_BACKUP); !errors.Is(err, ErrBusy) {
		t.Fatalf("start while the agent stays busy: %v, want ErrBusy", err)
	}

	// Other refusals are not retried.
	calls.Store(0)
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		http.Error(w, "no such model", http.StatusBadRequest)
	}))
	defer bad.Close()
	cb, _ := NewClient(bad.URL, nil)
	if err := cb.StartInstance(ctx, "m", hamsv1.Role_ROLE_BACKUP); err == nil || calls.Load() != 1 {
		t.Fatalf("a 400 answer: err %v after %d calls, want an error after 1", err, calls.Load())
	}
}
