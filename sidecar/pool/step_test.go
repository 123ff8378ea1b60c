package pool

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/testing/logbuf"
	"github.com/hams-go/hams/protocol"
	"github.com/hams-go/hams/protocol/parity"
)

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// strayEvent is an event of no machine the pool drives.
type strayEvent struct{}

func (strayEvent) String() string { return "stray event" }
func (strayEvent) ProtocolEvent() {}

// An event the machine refuses is a driver bug: step logs it at error
// level with the event, counts it, returns it, and does not panic; the
// pool goes on serving.
func TestStepRefusedEventLoggedAndCounted(t *testing.T) {
	var logs logbuf.Buffer
	data, _ := instances(newWeights(1), 2)
	p, stop := runPool(t, Config{Model: "m", Data: data, Redundancy: parity.RedundancyNone,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registry: prometheus.NewRegistry()})
	defer stop()

	p.mu.Lock()
	err := p.step(strayEvent{})
	p.mu.Unlock()
	if !errors.Is(err, protocol.ErrUnknownEvent) {
		t.Fatalf("step(stray) = %v, want an error wrapping protocol.ErrUnknownEvent", err)
	}
	if got := counterValue(t, p.metrics.driverErrors); got != 1 {
		t.Errorf("hams_pool_driver_errors_total = %v, want 1", got)
	}
	if out := logs.String(); !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "stray event") {
		t.Errorf("log lacks an error naming the event:\n%s", out)
	}

	resp, err := p.Infer(context.Background(), batchOf(2, 7))
	if err != nil || len(resp.GetOutputs()) == 0 {
		t.Fatalf("Infer after a refused event = %v, %v; want an answer", resp, err)
	}
}

// A batch the machine does not take (here: its id was submitted behind the
// driver's back) is answered with an Internal error at once, not left
// waiting for an answer that will never come.
func TestRefusedSubmitAnswersTheCaller(t *testing.T) {
	data, _ := instances(newWeights(1), 1)
	p, stop := runPool(t, Config{Model: "m", Data: data, Redundancy: parity.RedundancyNone, Registry: prometheus.NewRegistry()})
	defer stop()
	<-p.started

	p.mu.Lock()
	if _, err := p.m.Step(parity.Submitted{Batch: p.nextID + 1, Now: p.now()}); err != nil {
		p.mu.Unlock()
		t.Fatal(err)
	}
	p.mu.Unlock()
	_, err := p.Infer(context.Background(), batchOf(1, 3))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "submitted twice") {
		t.Fatalf("Infer of a refused batch = %v, want Internal naming the refusal", err)
	}
	if got := counterValue(t, p.metrics.driverErrors); got != 1 {
		t.Errorf("hams_pool_driver_errors_total = %v, want 1", got)
	}
	p.mu.Lock()
	left := len(p.calls)
	p.mu.Unlock()
	if left != 0 {
		t.Errorf("%d calls kept after the refused submit, want 0", left)
	}
}
