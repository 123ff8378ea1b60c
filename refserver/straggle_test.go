package refserver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

func schedule(c StraggleConfig, n int) string {
	var b strings.Builder
	for w := range uint64(n) {
		if c.Slow(w) {
			b.WriteByte('S')
		} else {
			b.WriteByte('.')
		}
	}
	return b.String()
}

func TestStraggleScheduleIsAPureFunctionOfSeedAndWindow(t *testing.T) {
	c := StraggleConfig{Seed: 7, Period: time.Second, Fraction: 0.2, Delay: time.Millisecond}
	a := schedule(c, 2000)
	if b := schedule(c, 2000); a != b {
		t.Fatal("same seed, two schedules")
	}
	// Asked in any order, window by window, the answer is the same.
	for _, w := range []uint64{1999, 3, 1000, 0, 3} {
		if c.Slow(w) != (a[w] == 'S') {
			t.Fatalf("window %d answered differently out of order", w)
		}
	}
	// Golden: the schedule of seed 7 must not change between versions
	// (benchmarks compare runs by seed).
	if got, want := a[:40], ".S......S..S..S...S.S...S.S..S..S.S....."; got != want {
		t.Errorf("seed 7 schedule changed:\n got %s\nwant %s", got, want)
	}
	c8 := c
	c8.Seed = 8
	other := schedule(c8, 2000)
	diff := 0
	for i := range a {
		if a[i] != other[i] {
			diff++
		}
	}
	// Two independent 0.2 schedules differ in about 32% of windows.
	if diff < 400 {
		t.Fatalf("seeds 7 and 8 differ in %d of 2000 windows", diff)
	}
	// Consecutive windows are not correlated: P(slow | previous slow)
	// stays near the fraction.
	pairs, both := 0, 0
	for i := 1; i < len(a); i++ {
		if a[i-1] == 'S' {
			pairs++
			if a[i] == 'S' {
				both++
			}
		}
	}
	if r := float64(both) / float64(pairs); r < 0.12 || r > 0.28 {
		t.Fatalf("P(slow | previous slow) = %.3f for fraction 0.2", r)
	}
}

func TestStraggleFraction(t *testing.T) {
	const n = 10000
	for _, f := range []float64{0, 0.05, 0.2, 0.5, 0.9, 1} {
		for _, seed := range []uint64{1, 42} {
			c := StraggleConfig{Seed: seed, Period: time.Second, Fraction: f, Delay: time.Millisecond}
			got := float64(strings.Count(schedule(c, n), "S")) / n
			if got < f-0.02 || got > f+0.02 || (f == 0 && got != 0) || (f == 1 && got != 1) {
				t.Errorf("fraction %v seed %d: %.4f of %d windows slow", f, seed, got, n)
			}
		}
	}
}

// fakeClock is a settable clock; its wait records the asked duration and
// advances the clock by it.
type fakeClock struct {
	mu    sync.Mutex
	t     time.Time
	waits []time.Duration
}

func (f *fakeClock) now() time.Time  { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeClock) set(t time.Time) { f.mu.Lock(); f.t = t; f.mu.Unlock() }
func (f *fakeClock) wait(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	f.waits = append(f.waits, d)
	f.t = f.t.Add(d)
	f.mu.Unlock()
	return ctx.Err()
}

func fakeStraggler(t *testing.T, c StraggleConfig) (*Straggler, *fakeClock, time.Time) {
	t.Helper()
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &fakeClock{t: start}
	s, err := NewStraggler(c, start, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	s.wait = clk.wait
	return s, clk, start
}

// windows returns a slow window followed by a fast one, and a fast window.
func windows(t *testing.T, c StraggleConfig) (slow, fast uint64) {
	t.Helper()
	slow, fast = ^uint64(0), ^uint64(0)
	for w := uint64(0); w < 1000 && (slow == ^uint64(0) || fast == ^uint64(0)); w++ {
		if c.Slow(w) && !c.Slow(w+1) && slow == ^uint64(0) {
			slow = w
		}
		if !c.Slow(w) && fast == ^uint64(0) {
			fast = w
		}
	}
	if slow == ^uint64(0) || fast == ^uint64(0) {
		t.Fatal("no slow and fast windows in 1000")
	}
	return slow, fast
}

func TestStragglerDelaysSlowWindowsOnly(t *testing.T) {
	c := StraggleConfig{Seed: 3, Period: 100 * time.Millisecond, Fraction: 0.3, Delay: 40 * time.Millisecond, Jitter: 5 * time.Millisecond}
	s, clk, start := fakeStraggler(t, c)
	slow, fast := windows(t, c)
	ctx := context.Background()
	clk.set(start.Add(time.Duration(fast)*c.Period + c.Period/2))
	if d, isSlow, err := s.Wait(ctx); d != 0 || isSlow || err != nil || len(clk.waits) != 0 {
		t.Fatalf("fast window %d: waited %v, slow %v, %v, waits %v", fast, d, isSlow, err, clk.waits)
	}
	at := start.Add(time.Duration(slow)*c.Period + c.Period/3)
	var jitters []time.Duration
	for i := range 20 {
		clk.set(at)
		if _, isSlow, err := s.Wait(ctx); !isSlow || err != nil {
			t.Fatalf("slow window %d: slow %v, %v", slow, isSlow, err)
		}
		d := clk.waits[i]
		if d < c.Delay || d > c.Delay+c.Jitter {
			t.Fatalf("slow window: waited %v, want %v..%v", d, c.Delay, c.Delay+c.Jitter)
		}
		// The jitter is the seeded draw of this call.
		if want := c.Delay + c.JitterAt(slow, uint64(i)); d != want {
			t.Fatalf("call %d: waited %v, want %v", i, d, want)
		}
		jitters = append(jitters, d)
	}
	distinct := map[time.Duration]bool{}
	for _, j := range jitters {
		distinct[j] = true
	}
	if len(distinct) < 5 {
		t.Fatalf("jitter draws %v are not spread", jitters)
	}
	if s.Delayed() != 20 {
		t.Fatalf("delayed %d, want 20", s.Delayed())
	}
	// Before the start is window 0.
	if s.Window(start.Add(-time.Hour)) != 0 || s.Window(start.Add(c.Period*5+1)) != 5 {
		t.Fatal("window index")
	}
}

func TestStragglerRealDelay(t *testing.T) {
	c := StraggleConfig{Seed: 1, Period: time.Hour, Fraction: 1, Delay: 30 * time.Millisecond}
	s, err := NewStraggler(c, time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	d, slow, err := s.Wait(context.Background())
	if el := time.Since(begin); !slow || err != nil || el < c.Delay || d < c.Delay {
		t.Fatalf("always-slow straggler: elapsed %v, waited %v, slow %v, %v", el, d, slow, err)
	}
	c.Fraction = 0
	c.Delay = 0
	s, _ = NewStraggler(c, time.Now(), nil)
	if d, slow, err := s.Wait(context.Background()); d != 0 || slow || err != nil {
		t.Fatalf("never-slow straggler: %v %v %v", d, slow, err)
	}
}

func TestStragglerFreezeBlocksUntilTheWindowEnds(t *testing.T) {
	c := StraggleConfig{Seed: 11, Period: time.Second, Fraction: 0.4, Freeze: true}
	// Fake clock: a call a third into a slow run waits to the run's end.
	s, clk, start := fakeStraggler(t, c)
	slow, _ := windows(t, c)
	// The run holding slow may begin earlier: find its first window.
	first := slow
	for first > 0 && c.Slow(first-1) {
		first--
	}
	clk.set(start.Add(time.Duration(first)*c.Period + c.Period/3))
	if _, isSlow, err := s.Wait(context.Background()); !isSlow || err != nil {
		t.Fatal(isSlow, err)
	}
	end := start.Add(time.Duration(slow+1) * c.Period)
	if got := clk.now(); !got.Equal(end) {
		t.Fatalf("frozen call released at %v, want the run's end %v", got.Sub(start), end.Sub(start))
	}
	// Real clock: place "now" 40 ms before the end of a slow window.
	const left = 40 * time.Millisecond
	rs, err := NewStraggler(c, time.Now().Add(-(time.Duration(slow+1)*c.Period - left)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if w := rs.Window(time.Now()); w != slow {
		t.Fatalf("set-up: in window %d, want %d", w, slow)
	}
	if _, isSlow, err := rs.Wait(context.Background()); !isSlow || err != nil {
		t.Fatal(isSlow, err)
	}
	if w := rs.Window(time.Now()); w <= slow {
		t.Fatalf("frozen call returned in window %d, before slow window %d ended", w, slow)
	}
}

func TestStragglerCancelledContextReturnsAtOnce(t *testing.T) {
	for _, c := range []StraggleConfig{
		{Seed: 1, Period: 1000 * time.Hour, Fraction: 1, Delay: time.Hour},
		{Seed: 1, Period: 1000 * time.Hour, Fraction: 1, Freeze: true}, // frozen for good
		{Seed: 1, Period: 10 * time.Millisecond, Fraction: 1, Freeze: true},
	} {
		s, err := NewStraggler(c, time.Now(), nil)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := s.Plan(time.Now())
		if c.Freeze && d >= 0 {
			t.Fatalf("%v: an endless freeze planned %v", c, d)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		begin := time.Now()
		if _, slow, err := s.Wait(ctx); !slow || !errors.Is(err, context.Canceled) {
			t.Fatalf("%v: cancelled: slow %v, %v", c, slow, err)
		}
		ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, _, err = s.Wait(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%v: deadline: %v", c, err)
		}
		if el := time.Since(begin); el > 5*time.Second {
			t.Fatalf("%v: took %v to give up", c, el)
		}
	}
}

func TestParseStraggle(t *testing.T) {
	c, err := ParseStraggle("seed=7,period=200ms,fraction=0.2,delay=40ms,jitter=5ms,freeze=false")
	want := StraggleConfig{Seed: 7, Period: 200 * time.Millisecond, Fraction: 0.2, Delay: 40 * time.Millisecond, Jitter: 5 * time.Millisecond}
	if err != nil || c != want {
		t.Fatalf("got %+v, %v", c, err)
	}
	if back, err := ParseStraggle(c.String()); err != nil || back != c {
		t.Fatalf("String %q does not round-trip: %+v, %v", c.String(), back, err)
	}
	if c, err := ParseStraggle(" period = 1s , fraction=1, freeze=true "); err != nil || !c.Freeze || c.Seed != 0 {
		t.Fatalf("spaces and defaults: %+v, %v", c, err)
	}
	for spec, names := range map[string]string{
		"": "empty",
		"period=1s,fraction=0.2,delay=1ms,sede=3":      `"sede"`,
		"period=1s,fraction=0.2,delay=fast":            `delay: bad value "fast"`,
		"period=1s,fraction=x,delay=1ms":               `fraction: bad value "x"`,
		"period=1s,fraction=0.2,delay=1ms,seed=-1":     `seed: bad value "-1"`,
		"period=1s,fraction=0.2,delay=1ms,freeze=9":    `freeze: bad value "9"`,
		"period=1s,fraction=0.2,delay":                 `"delay" in spec`,
		"period=1s,period=2s,fraction=0.2":             `"period" given twice`,
		"fraction=0.2,delay=1ms":                       "period is required",
		"period=1s,delay=1ms":                          "fraction is required",
		"period=0s,fraction=0.2,delay=1ms":             "period 0s",
		"period=1s,fraction=1.5,delay=1ms":             "fraction 1.5",
		"period=1s,fraction=0.2,delay=-1ms":            "delay -1ms",
		"period=1s,fraction=0.2,delay=1ms,jitter=-1ms": "jitter -1ms",
		"period=1s,fraction=0.2,delay=1ms,freeze=true": "freeze",
		"period=1s,fraction=0.2":                       "slows nothing",
	} {
		_, err := ParseStraggle(spec)
		if !errors.Is(err, ErrStraggle) || !strings.Contains(err.Error(), names) || !strings.HasPrefix(err.Error(), "refserver: ") {
			t.Errorf("%q: error %v does not name %s", spec, err, names)
		}
	}
}

// startStraggling serves the fashion classifier from a server with the
// given straggle config.
func startStraggling(t *testing.T, sc *StraggleConfig) (*Server, *env) {
	t.Helper()
	d, err := config.Parse([]byte(testYAML))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, err := New(Config{Deployment: d, Models: []string{"fashion", "seq"}, GRPCListener: lis, Registry: reg,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Straggle: sc})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	cc, err := grpcx.Dial(lis.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return srv, &env{srv: srv, cc: cc, reg: reg, rt: hamsv1.NewModelRuntimeClient(cc), ks: inference.NewGRPCInferenceServiceClient(cc),
		tf: tfapis.NewPredictionServiceClient(cc), ms: tfapis.NewModelServiceClient(cc)}
}

func TestServerStragglesOnEveryAPI(t *testing.T) {
	const delay = 25 * time.Millisecond
	srv, e := startStraggling(t, &StraggleConfig{Seed: 1, Period: 1000 * time.Hour, Fraction: 1, Delay: delay})
	ctx := ctxT(t)
	img := f32("images", 2, 784, 0.3)
	tp, err := wire.ToTensorProto(img)
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"Infer": func() error {
			_, err := e.rt.Infer(ctx, &hamsv1.BatchRequest{Model: "fashion", Inputs: []*hamsv1.Tensor{img}, BatchId: 1})
			return err
		},
		"Compute": func() error {
			_, err := e.rt.Compute(ctx, &hamsv1.BatchRequest{Model: "seq", Inputs: []*hamsv1.Tensor{f32("x", 1, 4, 0.1)}, StreamIds: []string{"a"}, BatchId: 1})
			return err
		},
		"ModelInfer": func() error {
			_, err := e.ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "fashion", Inputs: []*inference.ModelInferRequest_InferInputTensor{wire.InferInput(img)}, RawInputContents: [][]byte{img.Data}})
			return err
		},
		"Predict": func() error {
			_, err := e.tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion"}, Inputs: map[string]*tfpb.TensorProto{"images": tp}})
			return err
		},
	}
	for name, call := range calls {
		begin := time.Now()
		if err := call(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if el := time.Since(begin); el < delay {
			t.Errorf("%s answered in %v, under the %v delay", name, el, delay)
		}
	}
	// Update is not delayed and not counted.
	if _, err := e.rt.Update(ctx, &hamsv1.UpdateRequest{Model: "seq", BatchId: 1}); err != nil {
		t.Fatal(err)
	}
	if got := srv.Straggler().Delayed(); got != uint64(len(calls)) {
		t.Fatalf("straggler delayed %d calls, want %d", got, len(calls))
	}
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	var secs float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "hams_modelserver_straggle_delayed_total":
				for _, l := range m.GetLabel() {
					if l.GetName() == "method" {
						counts[l.GetValue()] += m.GetCounter().GetValue()
					}
				}
			case "hams_modelserver_straggle_delay_seconds_total":
				secs += m.GetCounter().GetValue()
			}
		}
	}
	for name := range calls {
		if counts[name] != 1 {
			t.Errorf("metric: %s delayed %v times, want 1 (%v)", name, counts[name], counts)
		}
	}
	if secs < 4*delay.Seconds() {
		t.Errorf("metric: %.3f s waited, want >= %.3f", secs, 4*delay.Seconds())
	}
}

func TestServerFrozenCallEndsWithItsDeadline(t *testing.T) {
	_, e := startStraggling(t, &StraggleConfig{Seed: 1, Period: 1000 * time.Hour, Fraction: 1, Freeze: true})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	begin := time.Now()
	_, err := e.rt.Infer(ctx, &hamsv1.BatchRequest{Model: "fashion", Inputs: []*hamsv1.Tensor{f32("images", 1, 784, 0.3)}, BatchId: 1})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("frozen server: %v", err)
	}
	if el := time.Since(begin); el > 5*time.Second {
		t.Fatalf("frozen call took %v to end at its deadline", el)
	}
	// Describe and health still answer.
	if _, err := e.rt.Describe(ctxT(t), &hamsv1.DescribeRequest{Model: "fashion"}); err != nil {
		t.Fatal(err)
	}
}

func TestNewRejectsBadStraggle(t *testing.T) {
	d, _ := config.Parse([]byte(testYAML))
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	defer lis.Close()
	_, err := New(Config{Deployment: d, Models: []string{"fashion"}, GRPCListener: lis, Straggle: &StraggleConfig{Period: 0, Fraction: 0.5, Delay: time.Millisecond}})
	if !errors.Is(err, ErrConfig) || !errors.Is(err, ErrStraggle) || !strings.Contains(err.Error(), "period") {
		t.Fatalf("bad straggle config: %v", err)
	}
}
