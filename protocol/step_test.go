package protocol_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/hams-go/hams/protocol"
	"github.com/hams-go/hams/protocol/lineage"
	"github.com/hams-go/hams/protocol/nspb"
	"github.com/hams-go/hams/protocol/parity"
	"github.com/hams-go/hams/protocol/recovery"
)

// alien is an event no machine handles.
type alien struct{}

func (alien) ProtocolEvent() {}
func (alien) String() string { return "alien" }

func machines(t *testing.T) map[string]protocol.Machine {
	t.Helper()
	rec, err := recovery.New(recovery.Config{Graph: recovery.NewGraphFromEdges(map[string]bool{"a": true},
		[][2]string{{"frontend", "a"}, {"a", "frontend"}})})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := parity.NewMachine(parity.Config{Redundancy: parity.RedundancyNone, DataInstances: 1})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]protocol.Machine{
		"pipeline": nspb.NewPipeline(nspb.NSPB, 0),
		"backup":   nspb.NewBackup("b", []string{"a"}, []string{"frontend"}, 0, 0),
		"gate":     nspb.NewReplyGate(),
		"recovery": rec,
		"parity":   pool,
		"lineage":  lineage.NewFlow(),
	}
}

func TestEveryMachineRejectsAForeignEvent(t *testing.T) {
	for name, m := range machines(t) {
		acts, err := m.Step(alien{})
		if !errors.Is(err, protocol.ErrUnknownEvent) || acts != nil {
			t.Errorf("%s: Step(alien) = %v, %v; want ErrUnknownEvent", name, acts, err)
		}
	}
}

// An event out of order is an error and changes nothing: the machine goes
// on as if it had never seen it.
func TestOutOfOrderEventsChangeNothing(t *testing.T) {
	p := nspb.NewPipeline(nspb.NSPB, 0)
	for _, ev := range []protocol.Event{nspb.Computed{Batch: 1}, nspb.ComputeStarted{Batch: 2}, nspb.Updated{Batch: 1},
		nspb.Copied{Batch: 1}, nspb.CopyLost{Batch: 0}, nspb.Acked{Batch: 1}} {
		if _, err := p.Step(ev); !errors.Is(err, protocol.ErrOutOfOrder) {
			t.Fatalf("Step(%v) = %v, want ErrOutOfOrder", ev, err)
		}
	}
	if c, u, cp, a, r := p.Progress(); c+u+cp+a+r != 0 || !p.CanCompute() {
		t.Fatalf("pipeline changed: %d %d %d %d %d", c, u, cp, a, r)
	}
	acts, err := protocol.StepAll(p, nspb.ComputeStarted{Batch: 1}, nspb.Computed{Batch: 1})
	if err != nil || protocol.Render("", acts) != "release batch=1\nupdate batch=1\n" {
		t.Fatalf("after the rejected events: %v %v", acts, err)
	}
	if _, err := p.Step(nspb.ComputeStarted{Batch: 2}); !errors.Is(err, protocol.ErrOutOfOrder) {
		t.Fatalf("compute 2 before update 1: %v", err)
	}

	b := nspb.NewBackup("b", []string{"a"}, nil, 0, 0)
	for _, s := range []nspb.SnapshotMeta{{BatchID: 1, Deps: map[string]uint64{"x": 1}}, {BatchID: 0}} {
		if _, err := b.Step(nspb.SnapshotReceived{Snapshot: s}); !errors.Is(err, protocol.ErrInvalidEvent) {
			t.Fatalf("snapshot %+v: %v, want ErrInvalidEvent", s, err)
		}
	}
	if len(b.Pending()) != 0 {
		t.Fatalf("backup changed: pending %v", b.Pending())
	}

	m := machines(t)
	if _, err := m["recovery"].Step(recovery.ActionDone{ID: 7}); !errors.Is(err, protocol.ErrOutOfOrder) || !errors.Is(err, recovery.ErrUnknownAction) {
		t.Fatalf("recovery: done #7 while idle: %v", err)
	}
	pool := m["parity"]
	if _, err := pool.Step(parity.Submitted{Batch: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Step(parity.Submitted{Batch: 1}); !errors.Is(err, protocol.ErrOutOfOrder) {
		t.Fatalf("parity: batch submitted twice: %v", err)
	}
	if n := pool.(*parity.Machine).Pending(); n != 1 {
		t.Fatalf("parity: %d pending after a rejected submit, want 1", n)
	}
}

// Step and the direct methods are the same machine: a random driver run
// through both gives the same actions, for every mode and copy option.
func TestPipelineStepMatchesDirectMethods(t *testing.T) {
	for _, mode := range []nspb.Mode{nspb.Bare, nspb.NSPB, nspb.Remus, nspb.NSPBS1, nspb.NSPBS2} {
		for _, opt := range []string{"eager", "on-demand", "capture"} {
			for seed := range uint64(20) {
				t.Run(fmt.Sprintf("%s/%s/%d", mode, opt, seed), func(t *testing.T) {
					comparePipelines(t, mode, opt, rand.New(rand.NewPCG(seed, 1)))
				})
			}
		}
	}
}

func comparePipelines(t *testing.T, mode nspb.Mode, opt string, rng *rand.Rand) {
	direct, stepped := nspb.NewPipeline(mode, 0), nspb.NewPipeline(mode, 0)
	switch opt {
	case "on-demand":
		direct.CopyOnDemand()
		stepped.CopyOnDemand()
	case "capture":
		direct.CaptureAtCompute()
		stepped.CaptureAtCompute()
	}
	// outstanding: the completions the driver owes (answers to actions,
	// in any order; acks cumulative).
	var outstanding []protocol.Event
	var shipped []uint64
	owe := func(acts []protocol.Action) {
		for _, a := range acts {
			switch a := a.(type) {
			case nspb.Update:
				outstanding = append(outstanding, nspb.Updated{Batch: a.Batch})
			case nspb.Copy:
				outstanding = append(outstanding, nspb.Copied{Batch: a.Batch})
			case nspb.Ship:
				shipped = append(shipped, a.Batch)
			}
		}
	}
	for step := 0; step < 200; step++ {
		var ev protocol.Event
		var want []protocol.Action
		switch k := rng.IntN(4); {
		case k == 0 && direct.CanCompute():
			n := direct.StartCompute()
			ev = nspb.ComputeStarted{Batch: n}
			outstanding = append(outstanding, nspb.Computed{Batch: n})
		case k == 1 && len(shipped) > 0:
			n := shipped[rng.IntN(len(shipped))]
			ev, want = nspb.Acked{Batch: n}, direct.Acked(n)
		case k == 2 && opt == "on-demand":
			ev, want = nspb.CopyWanted{}, direct.RequestCopy()
		case len(outstanding) > 0:
			i := rng.IntN(len(outstanding))
			ev = outstanding[i]
			outstanding = slices.Delete(outstanding, i, i+1)
			switch e := ev.(type) {
			case nspb.Computed:
				want = direct.Computed(e.Batch)
			case nspb.Updated:
				want = direct.Updated(e.Batch)
			case nspb.Copied:
				want = direct.Copied(e.Batch)
			}
		default:
			continue
		}
		got, err := stepped.Step(ev)
		if err != nil {
			t.Fatalf("step %d: Step(%v): %v", step, ev, err)
		}
		if protocol.Render("", got) != protocol.Render("", want) {
			t.Fatalf("step %d: %v: Step gave\n%s direct gave\n%s", step, ev, protocol.Render("", got), protocol.Render("", want))
		}
		owe(want)
	}
	c1, u1, cp1, a1, r1 := direct.Progress()
	c2, u2, cp2, a2, r2 := stepped.Progress()
	if [5]uint64{c1, u1, cp1, a1, r1} != [5]uint64{c2, u2, cp2, a2, r2} {
		t.Fatalf("progress differs: direct %v, stepped %v", [5]uint64{c1, u1, cp1, a1, r1}, [5]uint64{c2, u2, cp2, a2, r2})
	}
	if c1 == 0 {
		t.Fatal("nothing computed: the driver is stuck")
	}
}

func TestSelectActionsRender(t *testing.T) {
	acts := []protocol.Action{nspb.Release{Batch: 1}, nspb.Apply{BatchID: 2, MaxSeq: 5}, nspb.Release{Batch: 3}}
	if rs := protocol.Select[nspb.Release](acts); len(rs) != 2 || rs[1].Batch != 3 {
		t.Fatalf("Select: %v", rs)
	}
	if protocol.Actions([]recovery.Action(nil)) != nil {
		t.Fatal("Actions(nil) != nil")
	}
	ra := protocol.Actions([]recovery.Action{{ID: 1, Kind: recovery.Promote, Component: "x", Model: "a", Epoch: 2}})
	if got := protocol.Render("> ", ra); got != "> #1 Promote(x@a epoch=2 start=0)\n" {
		t.Fatalf("Render: %q", got)
	}
	if got := protocol.Render("", acts); got != "release batch=1\napply batch=2 maxseq=5\nrelease batch=3\n" {
		t.Fatalf("Render: %q", got)
	}
}
