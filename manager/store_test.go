package manager

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// newTestStore starts an embedded server (random port, store in a temp dir)
// and returns a store over a fresh bucket.
func newTestStore(t *testing.T) (*store, *metrics) {
	t.Helper()
	cfg := &Config{
		Deployment: &config.Deployment{Name: "cas test"},
		StoreDir:   t.TempDir(),
		NATSListen: "127.0.0.1:-1",
	}
	nc, err := connectNATS(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.close)
	js, err := jetstream.New(nc.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketName(cfg.Deployment.Name), Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	met := newMetrics(prometheus.NewRegistry())
	return &store{kv: kv, metrics: met}, met
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestBucketName(t *testing.T) {
	for in, want := range map[string]string{"hams": "hams_hams", "my dep.v2": "hams_my_dep_v2", "a-b_C9": "hams_a-b_C9"} {
		if got := BucketName(in); got != want {
			t.Errorf("BucketName(%q) = %q, want %q", in, got, want)
		}
	}
}

// Two concurrent updates from the same base revision: both are applied,
// the loser is retried once.
func TestStoreCASConflictRetried(t *testing.T) {
	s, met := newTestStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t0, err := s.ensure(ctx, &hamsv1.Topology{Deployment: "cas test"})
	if err != nil {
		t.Fatal(err)
	}
	if t0.GetRevision() == 0 {
		t.Fatal("ensure returned revision 0")
	}
	// ensure on an existing key returns it unchanged.
	if again, err := s.ensure(ctx, &hamsv1.Topology{Deployment: "other"}); err != nil || again.GetDeployment() != "cas test" || again.GetRevision() != t0.GetRevision() {
		t.Fatalf("second ensure = %v, %v; want the stored topology", again, err)
	}

	aRead := make(chan struct{})
	bDone := make(chan struct{})
	var aCalls atomic.Int32
	var wg sync.WaitGroup
	var aTopo, bTopo *hamsv1.Topology
	var aErr, bErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		aTopo, aErr = s.mutate(ctx, func(t *hamsv1.Topology) {
			if aCalls.Add(1) == 1 {
				// First attempt: let B commit on top of the revision A read.
				close(aRead)
				<-bDone
			}
			t.Frontends = append(t.Frontends, "a:1")
		})
	}()
	go func() {
		defer wg.Done()
		<-aRead
		bTopo, bErr = s.mutate(ctx, func(t *hamsv1.Topology) {
			t.Frontends = append(t.Frontends, "b:1")
		})
		close(bDone)
	}()
	wg.Wait()
	if aErr != nil || bErr != nil {
		t.Fatalf("mutate errors: a=%v b=%v", aErr, bErr)
	}
	if n := aCalls.Load(); n != 2 {
		t.Fatalf("A's mutation ran %d times, want 2 (one conflict, one retry)", n)
	}
	if got := counterValue(t, met.kvConflicts); got != 1 {
		t.Fatalf("kv conflicts = %v, want 1", got)
	}
	if bTopo.GetRevision() != t0.GetRevision()+1 || aTopo.GetRevision() != t0.GetRevision()+2 {
		t.Fatalf("revisions: b=%d a=%d, want %d then %d", bTopo.GetRevision(), aTopo.GetRevision(), t0.GetRevision()+1, t0.GetRevision()+2)
	}
	e, err := s.kv.Get(ctx, TopologyKey)
	if err != nil {
		t.Fatal(err)
	}
	final, err := DecodeTopology(e)
	if err != nil {
		t.Fatal(err)
	}
	if got := final.GetFrontends(); len(got) != 2 || got[0] != "b:1" || got[1] != "a:1" {
		t.Fatalf("stored frontends = %v, want both updates [b:1 a:1]", got)
	}
	if final.GetRevision() != aTopo.GetRevision() {
		t.Fatalf("stored revision %d, mutate returned %d", final.GetRevision(), aTopo.GetRevision())
	}

	// A mutation that changes nothing writes nothing.
	same, err := s.mutate(ctx, func(*hamsv1.Topology) {})
	if err != nil || same.GetRevision() != final.GetRevision() {
		t.Fatalf("no-op mutate = rev %d, %v; want rev %d, no write", same.GetRevision(), err, final.GetRevision())
	}
}

func TestStoreMutateFailsWithoutKey(t *testing.T) {
	s, _ := newTestStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.mutate(ctx, func(*hamsv1.Topology) {}); err == nil {
		t.Fatal("mutate on a missing key succeeded")
	}
	if _, err := s.kv.Put(ctx, TopologyKey, []byte{0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.mutate(ctx, func(*hamsv1.Topology) {}); err == nil {
		t.Fatal("mutate over undecodable state succeeded")
	}
}

func TestHubOnlyMovesForward(t *testing.T) {
	h := newHub()
	_, ch := h.get()
	if !h.offer(&hamsv1.Topology{Revision: 5}) {
		t.Fatal("first offer refused")
	}
	select {
	case <-ch:
	default:
		t.Fatal("changed not closed")
	}
	_, ch = h.get()
	if h.offer(&hamsv1.Topology{Revision: 5}) || h.offer(&hamsv1.Topology{Revision: 4}) {
		t.Fatal("stale offer accepted")
	}
	select {
	case <-ch:
		t.Fatal("changed closed by a stale offer")
	default:
	}
	if cur, _ := h.get(); cur.GetRevision() != 5 {
		t.Fatalf("revision %d, want 5", cur.GetRevision())
	}
}
