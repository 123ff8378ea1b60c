package nspb

import (
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func graph(t *testing.T, edges [][2]string) *config.Graph {
	t.Helper()
	s := &config.Service{Name: "s", Edges: edges}
	return s.Graph()
}

func set(names ...string) func(string) bool {
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	return func(s string) bool { return m[s] }
}

func TestStatefulNeighbours(t *testing.T) {
	sp := graph(t, [][2]string{{"frontend", "sent"}, {"frontend", "arima"}, {"frontend", "knn"},
		{"sent", "combine"}, {"arima", "combine"}, {"knn", "combine"}, {"combine", "stock"}, {"stock", "frontend"}})
	pfm, nfm := StatefulNeighbours(sp, set("sent", "stock"))
	want := map[string][]string{"stock": {"sent"}, "frontend": {"stock"}}
	if !reflect.DeepEqual(pfm, want) {
		t.Fatalf("sp pfm %v", pfm)
	}
	if !reflect.DeepEqual(nfm, map[string][]string{"sent": {"stock"}, "stock": {"frontend"}}) {
		t.Fatalf("sp nfm %v", nfm)
	}
	// Two stateful branches meeting only at the frontend (sa), and a
	// stateful model behind a stateful one on one branch only.
	g := graph(t, [][2]string{{"frontend", "tr"}, {"tr", "a"}, {"tr", "b"}, {"a", "c"}, {"b", "x"}, {"x", "c"},
		{"c", "frontend"}, {"b", "frontend"}})
	pfm, nfm = StatefulNeighbours(g, set("a", "b", "c"))
	if !reflect.DeepEqual(pfm["c"], []string{"a", "b"}) || !reflect.DeepEqual(pfm["frontend"], []string{"b", "c"}) {
		t.Fatalf("pfm %v", pfm)
	}
	if !reflect.DeepEqual(nfm["b"], []string{"c", "frontend"}) || !reflect.DeepEqual(nfm["a"], []string{"c"}) {
		t.Fatalf("nfm %v", nfm)
	}
	if _, ok := pfm["a"]; ok {
		t.Fatalf("a has no stateful model upstream: %v", pfm["a"])
	}
}

func applied(acts []Action) []uint64 {
	var out []uint64
	for _, a := range acts {
		if ap, ok := a.(Apply); ok {
			out = append(out, ap.BatchID)
		}
	}
	return out
}

// The paper's Figure 6: Ma's state s_a^n is delayed; Mb processed r_b^n
// (derived from o_a^n) and shipped s_b^n, which reaches Mb's backup first.
// Mb's backup must hold s_b^n until Ma announces s_a^n durable.
func TestFigure6InterleavingWaitsForUpstreamDurability(t *testing.T) {
	b := NewBackup("b", []string{"a"}, []string{"frontend"}, 0, 0)
	lineage := []*hamsv1.LineageEntry{{PredModel: "frontend", PredSeq: 1, Model: "a", Seq: 1}, {PredModel: "a", PredSeq: 1, Model: "b", Seq: 1}}
	acts, err := b.Snapshot(SnapshotMeta{BatchID: 1, MaxSeq: 1, Deps: DepsOf([]string{"a"}, lineage)})
	if err != nil || len(acts) != 0 {
		t.Fatalf("snapshot applied before a's state is durable: %v %v", acts, err)
	}
	if id, m, need, have, blocked := b.Blocker(); !blocked || id != 1 || m != "a" || need != 1 || have != 0 {
		t.Fatalf("blocker %d %s %d %d %v", id, m, need, have, blocked)
	}
	// s_a^n durable: now s_b^n may be applied, then announced.
	acts = b.Durable("a", 1)
	if len(acts) != 2 {
		t.Fatalf("actions %v", acts)
	}
	if ap := acts[0].(Apply); ap.BatchID != 1 {
		t.Fatalf("apply %v", ap)
	}
	if an := acts[1].(Announce); an.Model != "b" || an.DurableSeq != 1 || !reflect.DeepEqual(an.To, []string{"frontend"}) {
		t.Fatalf("announce %v", an)
	}
}

func TestBackupAppliesInBatchOrder(t *testing.T) {
	b := NewBackup("b", []string{"a"}, nil, 0, 0)
	if acts, _ := b.Snapshot(SnapshotMeta{BatchID: 2, MaxSeq: 4, Deps: map[string]uint64{"a": 4}}); len(acts) != 0 {
		t.Fatal("batch 2 applied before batch 1")
	}
	if acts := b.Durable("a", 10); len(acts) != 0 {
		t.Fatal("batch 2 applied with batch 1 missing")
	}
	acts, _ := b.Snapshot(SnapshotMeta{BatchID: 1, MaxSeq: 2, Deps: map[string]uint64{"a": 2}})
	if got := applied(acts); !reflect.DeepEqual(got, []uint64{1, 2}) {
		t.Fatalf("applied %v", got)
	}
	if id, seq := b.Applied(); id != 2 || seq != 4 {
		t.Fatalf("applied %d %d", id, seq)
	}
	// A resend of an applied snapshot is ignored.
	if acts, err := b.Snapshot(SnapshotMeta{BatchID: 2, MaxSeq: 4}); err != nil || len(acts) != 0 {
		t.Fatal("duplicate snapshot applied twice")
	}
}

func TestBackupWaitsForEveryPFM(t *testing.T) {
	b := NewBackup("c", []string{"a", "b"}, []string{"frontend"}, 0, 0)
	b.Snapshot(SnapshotMeta{BatchID: 1, MaxSeq: 3, Deps: map[string]uint64{"a": 5, "b": 2}})
	if acts := b.Durable("a", 5); len(acts) != 0 {
		t.Fatal("applied while b is not durable")
	}
	if acts := b.Durable("b", 1); len(acts) != 0 {
		t.Fatal("applied while b is durable only to 1 < 2")
	}
	if acts := b.Durable("a", 4); len(acts) != 0 {
		t.Fatal("a regression triggered something")
	}
	if got := applied(b.Durable("b", 2)); !reflect.DeepEqual(got, []uint64{1}) {
		t.Fatalf("applied %v", got)
	}
}

func TestBackupRejectsDepsOnNonPFM(t *testing.T) {
	b := NewBackup("c", []string{"a"}, nil, 0, 0)
	_, err := b.Snapshot(SnapshotMeta{BatchID: 1, Deps: map[string]uint64{"zz": 1}})
	if err == nil || !strings.Contains(err.Error(), "zz") {
		t.Fatalf("got %v", err)
	}
	if acts := b.Durable("zz", 3); acts != nil {
		t.Fatal("durability of a non-PFM changed state")
	}
}

// A seeded in-memory network: primaries of a and b (PFMs of c) and of c
// produce batches; snapshots and durability notices travel with random
// delays and reordering (but each stream is delivered in order, as over a
// gRPC stream). At every Apply of c's backup, the ground truth holds: the
// backups of a and b have applied every state c's snapshot depends on.
func TestBackupRandomDelaysPreserveCausality(t *testing.T) {
	for seed := int64(1); seed <= 50; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { simulate(t, seed) })
	}
}

type msg struct {
	at   int
	to   string
	kind string // "snap" or "durable"
	snap SnapshotMeta
	from string
	seq  uint64
}

func simulate(t *testing.T, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	backups := map[string]*Backup{
		"a": NewBackup("a", nil, []string{"c"}, 0, 0),
		"b": NewBackup("b", nil, []string{"c"}, 0, 0),
		"c": NewBackup("c", []string{"a", "b"}, []string{"frontend"}, 0, 0),
	}
	truth := map[string]uint64{} // applied seq per model, ground truth
	var queue []msg
	lastAt := map[string]int{} // per stream, to keep FIFO
	send := func(now int, m msg, stream string) {
		d := now + 1 + rng.Intn(20)
		if rng.Intn(10) == 0 {
			d += 100 // a stalled link
		}
		if d <= lastAt[stream] {
			d = lastAt[stream] + 1
		}
		lastAt[stream] = d
		m.at = d
		queue = append(queue, m)
	}
	handle := func(now int, model string, acts []Action) {
		for _, a := range acts {
			switch a := a.(type) {
			case Apply:
				truth[model] = a.MaxSeq
			case Announce:
				for _, to := range a.To {
					if to == "frontend" {
						continue
					}
					send(now, msg{to: to, kind: "durable", from: model, seq: a.DurableSeq}, model+">"+to)
				}
			}
		}
	}
	// Primaries: a and b each run batches of 1-3 requests; c's batch k
	// consumes outputs of a and b produced so far.
	seqs := map[string]uint64{}
	batch := map[string]uint64{}
	var cDeps []map[string]uint64
	for now := 0; now < 400; now++ {
		for _, m := range []string{"a", "b"} {
			if rng.Intn(3) == 0 {
				seqs[m] += uint64(1 + rng.Intn(3))
				batch[m]++
				send(now, msg{to: m, kind: "snap", snap: SnapshotMeta{BatchID: batch[m], MaxSeq: seqs[m]}}, m+"-ship")
			}
		}
		if rng.Intn(3) == 0 && (seqs["a"] > 0 || seqs["b"] > 0) {
			deps := map[string]uint64{}
			for _, m := range []string{"a", "b"} {
				if seqs[m] > 0 {
					deps[m] = seqs[m] - uint64(rng.Intn(int(seqs[m]))) // consumed up to some output
				}
			}
			batch["c"]++
			seqs["c"] += 2
			cDeps = append(cDeps, deps)
			send(now, msg{to: "c", kind: "snap", snap: SnapshotMeta{BatchID: batch["c"], MaxSeq: seqs["c"], Deps: deps}}, "c-ship")
		}
		// Deliver everything due now.
		var rest []msg
		var due []msg
		for _, m := range queue {
			if m.at <= now {
				due = append(due, m)
			} else {
				rest = append(rest, m)
			}
		}
		queue = rest
		for _, m := range due {
			var acts []Action
			if m.kind == "snap" {
				var err error
				acts, err = backups[m.to].Snapshot(m.snap)
				if err != nil {
					t.Fatal(err)
				}
			} else {
				acts = backups[m.to].Durable(m.from, m.seq)
			}
			for _, a := range acts {
				if ap, ok := a.(Apply); ok && m.to == "c" {
					deps := cDeps[ap.BatchID-1]
					for pm, need := range deps {
						if truth[pm] < need {
							t.Fatalf("c applied batch %d needing %s>=%d while %s's backup has applied only %d", ap.BatchID, pm, need, pm, truth[pm])
						}
					}
				}
			}
			handle(now, m.to, acts)
		}
	}
	// Drain: deliver the rest in time order.
	for len(queue) > 0 {
		now := queue[0].at
		for _, m := range queue {
			if m.at < now {
				now = m.at
			}
		}
		var rest, due []msg
		for _, m := range queue {
			if m.at == now {
				due = append(due, m)
			} else {
				rest = append(rest, m)
			}
		}
		queue = rest
		for _, m := range due {
			var acts []Action
			if m.kind == "snap" {
				acts, _ = backups[m.to].Snapshot(m.snap)
			} else {
				acts = backups[m.to].Durable(m.from, m.seq)
			}
			handle(now, m.to, acts)
		}
	}
	for _, m := range []string{"a", "b", "c"} {
		if id, _ := backups[m].Applied(); id != batch[m] {
			t.Fatalf("%s: applied %d of %d batches at quiescence (pending %v)", m, id, batch[m], backups[m].Pending())
		}
	}
}

func TestReplyGate(t *testing.T) {
	g := NewReplyGate()
	if !g.Hold(1, nil) {
		t.Fatal("a reply with no stateful dependency must leave at once")
	}
	if g.Hold(2, map[string]uint64{"a": 3, "b": 1}) {
		t.Fatal("released before durable")
	}
	if g.Hold(3, map[string]uint64{"a": 2}) {
		t.Fatal("released before durable")
	}
	if got := g.Durable("a", 2); !reflect.DeepEqual(got, []uint64{3}) {
		t.Fatalf("released %v", got)
	}
	if got := g.Durable("a", 5); len(got) != 0 {
		t.Fatalf("2 released while b not durable: %v", got)
	}
	if got := g.Durable("b", 1); !reflect.DeepEqual(got, []uint64{2}) {
		t.Fatalf("released %v", got)
	}
	if !g.Hold(4, map[string]uint64{"a": 5}) {
		t.Fatal("a durable to 5 already")
	}
	g.Hold(5, map[string]uint64{"b": 9})
	g.Drop(5)
	if got := g.Durable("b", 9); len(got) != 0 || g.Held() != 0 {
		t.Fatalf("dropped request released: %v", got)
	}
}

// Random legal schedules of the primary pipeline in every mode: the
// in-flight operations (compute, update, copy, ack) finish in random order.
func TestPipelineInvariants(t *testing.T) {
	for _, mode := range []Mode{Bare, NSPB, Remus, NSPBS1, NSPBS2} {
		for seed := int64(1); seed <= 30; seed++ {
			checkPipeline(t, mode, seed, eager)
			checkPipeline(t, mode, seed, onDemand)
			checkPipeline(t, mode, seed, capture)
		}
	}
}

// On demand, a copy starts only when requested, covers every batch since
// the previous one, and updates go ahead without copies in between.
func TestPipelineCopyOnDemand(t *testing.T) {
	if NewPipeline(Remus, 0).CopyOnDemand() || NewPipeline(NSPBS2, 0).CopyOnDemand() || NewPipeline(Bare, 0).CopyOnDemand() {
		t.Fatal("stop-to-copy and bare modes must copy after every batch")
	}
	p := NewPipeline(NSPB, 0)
	if !p.CopyOnDemand() {
		t.Fatal("nspb copies on demand")
	}
	p.StartCompute()
	if got := p.Computed(1); !reflect.DeepEqual(got, []Action{Release{1}, Update{1}}) {
		t.Fatalf("computed 1: %v", got)
	}
	if got := p.Updated(1); len(got) != 0 {
		t.Fatalf("no copy requested, nothing to do: %v", got)
	}
	p.StartCompute()
	if got := p.Computed(2); !reflect.DeepEqual(got, []Action{Release{2}, Update{2}}) {
		t.Fatalf("update 2 without a copy of 1: %v", got)
	}
	if got := p.RequestCopy(); len(got) != 0 {
		t.Fatalf("copy during an update: %v", got)
	}
	if got := p.Updated(2); !reflect.DeepEqual(got, []Action{Copy{2}}) {
		t.Fatalf("requested copy after update 2: %v", got)
	}
	p.StartCompute()
	if got := p.Computed(3); !reflect.DeepEqual(got, []Action{Release{3}}) {
		t.Fatalf("update 3 during copy of 2: %v", got)
	}
	if got := p.Copied(2); !reflect.DeepEqual(got, []Action{Ship{2}, Update{3}}) {
		t.Fatalf("copied 2: %v", got)
	}
	if got := p.RequestCopy(); len(got) != 0 || !p.CopyRequested() {
		t.Fatalf("copy while updating: %v", got)
	}
	if got := p.Updated(3); !reflect.DeepEqual(got, []Action{Copy{3}}) {
		t.Fatalf("updated 3: %v", got)
	}
	if got := p.Copied(3); !reflect.DeepEqual(got, []Action{Ship{3}}) {
		t.Fatalf("copied 3: %v", got)
	}
	if got := p.RequestCopy(); len(got) != 0 {
		t.Fatalf("state 3 copied already: %v", got)
	}
	p.Acked(3)
	if _, _, c, a, r := p.Progress(); c != 3 || a != 3 || r != 3 {
		t.Fatalf("progress copied %d acked %d released %d", c, a, r)
	}
	// A copy lost after its capture: the batches it covered (4) go with
	// the next copy, of whatever state is installed then (5).
	p.StartCompute()
	p.Computed(4)
	if got := p.Updated(4); !reflect.DeepEqual(got, []Action{Copy{4}}) {
		t.Fatalf("the request stood: updated 4: %v", got)
	}
	p.StartCompute()
	p.Computed(5)
	if got := p.Copied(4); !reflect.DeepEqual(got, []Action{Ship{4}, Update{5}}) {
		t.Fatalf("copied 4: %v", got)
	}
	if got := p.CopyLost(4); len(got) != 0 {
		t.Fatalf("copy during update 5: %v", got)
	}
	if got := p.Updated(5); !reflect.DeepEqual(got, []Action{Copy{5}}) {
		t.Fatalf("after a lost copy, the next state is copied: %v", got)
	}
	// nspb-s1 releases a batch only with the ack of a copy covering it.
	q := NewPipeline(NSPBS1, 0)
	q.CopyOnDemand()
	q.StartCompute()
	q.Computed(1)
	q.Updated(1)
	q.StartCompute()
	q.Computed(2)
	q.RequestCopy()
	if got := q.Updated(2); !reflect.DeepEqual(got, []Action{Copy{2}}) {
		t.Fatalf("s1 updated 2: %v", got)
	}
	q.Copied(2)
	if got := q.Acked(2); !reflect.DeepEqual(got, []Action{Release{1}, Release{2}}) {
		t.Fatalf("s1 ack of the copy covering 1 and 2: %v", got)
	}
}

// How a checked pipeline gets its snapshots.
const (
	eager    = iota // copy after every update
	onDemand        // copy when requested
	capture         // compute returns the staged state
)

func checkPipeline(t *testing.T, mode Mode, seed int64, flavor int) {
	rng := rand.New(rand.NewSource(seed))
	p := NewPipeline(mode, 0)
	onDemand := flavor == onDemand
	if onDemand && !p.CopyOnDemand() || flavor == capture && !p.CaptureAtCompute() {
		return
	}
	lastComputed := uint64(0)
	shipped := uint64(0)
	var inflight []Action // Update, Copy, Ship pending completion; plus compute
	computing := uint64(0)
	updated, copied, acked, released := uint64(0), uint64(0), uint64(0), uint64(0)
	copyActive := uint64(0)
	do := func(acts []Action) {
		for _, a := range acts {
			switch a := a.(type) {
			case Release:
				if a.Batch != released+1 {
					t.Fatalf("%v seed %d: release %d after %d", mode, seed, a.Batch, released)
				}
				if mode.releaseOnAck() && acked < a.Batch {
					t.Fatalf("%v seed %d: release %d before the backup has it (acked %d)", mode, seed, a.Batch, acked)
				}
				released = a.Batch
			case Update:
				if mode != Bare && !onDemand && copied < a.Batch-1 {
					t.Fatalf("%v seed %d: update %d while copy of %d not done (half-updated copy)", mode, seed, a.Batch, a.Batch-1)
				}
				if copyActive != 0 {
					t.Fatalf("%v seed %d: update %d during copy %d", mode, seed, a.Batch, copyActive)
				}
				inflight = append(inflight, a)
			case Copy:
				if flavor == capture {
					t.Fatalf("%v seed %d: copy %d with capture at compute", mode, seed, a.Batch)
				}
				if a.Batch != updated || a.Batch <= copied {
					t.Fatalf("%v seed %d: copy of %d, installed %d, copied %d", mode, seed, a.Batch, updated, copied)
				}
				copyActive = a.Batch
				inflight = append(inflight, a)
			case Ship:
				if flavor == capture {
					// The snapshot is the compute's: of the batch that
					// just computed, and of none other.
					if a.Batch != lastComputed {
						t.Fatalf("%v seed %d: ship %d with capture, last computed %d", mode, seed, a.Batch, lastComputed)
					}
					copied = a.Batch
				}
				if a.Batch != copied || a.Batch <= shipped {
					t.Fatalf("%v seed %d: ship %d after %d, copied %d", mode, seed, a.Batch, shipped, copied)
				}
				shipped = a.Batch
				inflight = append(inflight, a)
			}
		}
	}
	const batches = 40
	for steps := 0; steps < 10000; steps++ {
		if onDemand && rng.Intn(3) == 0 {
			do(p.RequestCopy())
		}
		if computing == 0 && p.CanCompute() && rng.Intn(2) == 0 {
			computing = p.StartCompute()
			if computing != updated+1 {
				t.Fatalf("%v seed %d: compute %d on state %d", mode, seed, computing, updated)
			}
			if mode.stopToCopy() && copied < updated {
				t.Fatalf("%v seed %d: compute %d while copying %d (stop-to-copy)", mode, seed, computing, updated)
			}
			if computing > batches {
				break
			}
			continue
		}
		// Finish something at random.
		n := len(inflight)
		if computing != 0 {
			n++
		}
		if n == 0 && onDemand {
			do(p.RequestCopy())
			continue
		}
		if n == 0 {
			if !p.CanCompute() {
				t.Fatalf("%v seed %d: stuck", mode, seed)
			}
			continue
		}
		i := rng.Intn(n)
		if i == len(inflight) {
			c := computing
			computing = 0
			lastComputed = c
			do(p.Computed(c))
			continue
		}
		a := inflight[i]
		inflight = append(inflight[:i], inflight[i+1:]...)
		switch a := a.(type) {
		case Update:
			updated = a.Batch
			do(p.Updated(a.Batch))
		case Copy:
			copyActive = 0
			copied = a.Batch
			do(p.Copied(a.Batch))
		case Ship:
			acked = max(acked, a.Batch)
			do(p.Acked(a.Batch))
		}
	}
	if onDemand {
		// Drain: with copies requested, everything computed is released.
		if computing != 0 {
			c := computing
			computing = 0
			do(p.Computed(c))
		}
		for i := 0; i < 100 && (len(inflight) > 0 || released < updated); i++ {
			do(p.RequestCopy())
			if len(inflight) == 0 {
				continue
			}
			a := inflight[0]
			inflight = inflight[1:]
			switch a := a.(type) {
			case Update:
				updated = a.Batch
				do(p.Updated(a.Batch))
			case Copy:
				copyActive = 0
				copied = a.Batch
				do(p.Copied(a.Batch))
			case Ship:
				acked = max(acked, a.Batch)
				do(p.Acked(a.Batch))
			}
		}
		if released != updated {
			t.Fatalf("%v seed %d: drained: updated %d released %d", mode, seed, updated, released)
		}
	}
	if updated < batches-1 || released < batches-2 {
		t.Fatalf("%v seed %d: no progress: updated %d released %d", mode, seed, updated, released)
	}
}

// With capture at compute, compute n's response is snapshot n: it ships
// at once, updates never wait for a copy, and nspb-s1 releases on its ack.
func TestPipelineCaptureAtCompute(t *testing.T) {
	for _, m := range []Mode{Bare, Remus, NSPBS2} {
		if NewPipeline(m, 0).CaptureAtCompute() {
			t.Fatalf("%v captured at compute: stop-to-copy and bare modes copy the state", m)
		}
	}
	p := NewPipeline(NSPB, 0)
	if !p.CaptureAtCompute() || p.CopyOnDemand() {
		t.Fatal("nspb captures at compute, and then never copies on demand")
	}
	p.StartCompute()
	if got := p.Computed(1); !reflect.DeepEqual(got, []Action{Release{1}, Ship{1}, Update{1}}) {
		t.Fatalf("computed 1: %v", got)
	}
	if got := p.Updated(1); len(got) != 0 {
		t.Fatalf("updated 1: %v", got)
	}
	p.StartCompute()
	if got := p.Computed(2); !reflect.DeepEqual(got, []Action{Release{2}, Ship{2}, Update{2}}) {
		t.Fatalf("computed 2, before any ack: %v", got)
	}
	p.Acked(2)
	q := NewPipeline(NSPBS1, 0)
	q.CaptureAtCompute()
	q.StartCompute()
	if got := q.Computed(1); !reflect.DeepEqual(got, []Action{Ship{1}, Update{1}}) {
		t.Fatalf("s1 computed 1: %v", got)
	}
	q.Updated(1)
	q.StartCompute()
	q.Computed(2)
	if got := q.Acked(1); !reflect.DeepEqual(got, []Action{Release{1}}) {
		t.Fatalf("s1 ack 1: %v", got)
	}
}
