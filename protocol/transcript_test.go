package protocol_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/protocol"
	"github.com/hams-go/hams/protocol/internal/transcript"
	"github.com/hams-go/hams/protocol/lineage"
	"github.com/hams-go/hams/protocol/nspb"
	"github.com/hams-go/hams/protocol/parity"
	"github.com/hams-go/hams/protocol/recovery"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// TestTranscripts runs the paper's scenarios in testdata/*.txt: every
// machine of the scenario is a protocol.Machine, driven by one Step per
// event line; the output is the actions each Step returned, rendered by
// their String, prefixed by the machine's name. go test -run
// TestTranscripts -update rewrites the files with the actual outputs.
//
// Commands:
//
//	new NAME pipeline mode=nspb [start=N] [on-demand] [capture]
//	new NAME backup model=M pfm=A,B nfm=C,frontend
//	new NAME gate
//	new NAME recovery edges=frontend>a,a>b,b>frontend stateful=a,b [replay]
//	new NAME pool redundancy=parm k=2 r=1 data=2 parity=1
//	new NAME flow edges=frontend>a,a>b,b>frontend
//	NAME EVENT args...   one event for machine NAME (parseEvent)
//	NAME status [target=M]  the machine's counters (reads, not events)
//
// Events, by machine kind:
//
//	pipeline  compute-started|computed|updated|copied|copy-lost|acked batch=N, copy-wanted
//	backup    snapshot batch=N maxseq=N deps=a:1,b:2; durable MODEL seq=N
//	gate      reply-arrived req=N deps=a:1; durable MODEL seq=N; reply-dropped req=N
//	recovery  topology (placement lines below it, indented: COMPONENT MODEL ROLE
//	          epoch=N [dead], or frontend ADDRESS); suspect COMPONENT;
//	          maxseq id=N seq=N; summary id=N maxout=N maxin=a:1 [consumed-beyond];
//	          query-failed id=N [err=...]; done id=N [err=...]; alive-again COMPONENT;
//	          spare-joined COMPONENT
//	pool      submit batch=N; encoded group=N parity=J [bad]; done|fail batch=N inst=I [retry];
//	          pdone|pfail group=N parity=J inst=I; decoded group=N parities=0,1 [bad];
//	          cancel batch=N; tick (each may end with at=DURATION)
//	flow      observed lineage=pred:seq>model:seq,...
//
// A case may hold several lines; their outputs follow one another. A
// Step that returns no action prints nothing; a case none of whose lines
// printed anything prints "(no actions)". A Step error prints "error: ...".
func TestTranscripts(t *testing.T) {
	transcript.Walk(t, "testdata", func() func(*testing.T, *transcript.Case) string {
		h := &harness{machines: map[string]protocol.Machine{}}
		return h.run
	})
}

// harness holds one transcript's machines by name, across its cases.
type harness struct {
	machines map[string]protocol.Machine
}

func (h *harness) run(t *testing.T, c *transcript.Case) string {
	var out strings.Builder
	created := 0
	for _, line := range c.Lines {
		if strings.HasPrefix(line, "  ") {
			continue // the input of the line before (topology)
		}
		if strings.HasPrefix(line, "new ") {
			created++
		}
		out.WriteString(h.line(t, c, line))
	}
	if out.Len() == 0 && created == len(c.Lines) {
		return "ok"
	}
	if out.Len() == 0 {
		return "(no actions)"
	}
	return out.String()
}

func (h *harness) line(t *testing.T, c *transcript.Case, line string) string {
	f := strings.Fields(line)
	if f[0] == "new" {
		if len(f) < 3 {
			t.Fatalf("%s: new NAME KIND ...", c.Pos)
		}
		m, err := newMachine(f[2], f[3:])
		if err != nil {
			t.Fatalf("%s: %v", c.Pos, err)
		}
		h.machines[f[1]] = m
		return ""
	}
	m, ok := h.machines[f[0]]
	if !ok || len(f) < 2 {
		t.Fatalf("%s: no machine %q (or no event)", c.Pos, f[0])
	}
	if f[1] == "status" {
		return f[0] + ": " + status(m, f[2:]) + "\n"
	}
	ev, err := parseEventAt(m, f[1], f[2:], indented(c.Lines, line))
	if err != nil {
		t.Fatalf("%s: %q: %v", c.Pos, line, err)
	}
	acts, err := m.Step(ev)
	if err != nil {
		return fmt.Sprintf("%s: error: %v\n", f[0], err)
	}
	return protocol.Render(f[0]+": ", acts)
}

// indented returns the lines indented by two spaces that follow line.
func indented(lines []string, line string) []string {
	var out []string
	for i, l := range lines {
		if l != line {
			continue
		}
		for _, x := range lines[i+1:] {
			if !strings.HasPrefix(x, "  ") {
				break
			}
			out = append(out, strings.TrimSpace(x))
		}
		break
	}
	return out
}

func newMachine(kind string, args []string) (protocol.Machine, error) {
	switch kind {
	case "pipeline":
		v, _ := transcript.Arg(args, "mode")
		mode, err := nspb.ParseMode(v)
		if err != nil {
			return nil, err
		}
		start, err := transcript.Uint(args, "start", 0)
		if err != nil {
			return nil, err
		}
		p := nspb.NewPipeline(mode, start)
		if _, ok := transcript.Arg(args, "on-demand"); ok && !p.CopyOnDemand() {
			return nil, errors.New("on-demand refused")
		}
		if _, ok := transcript.Arg(args, "capture"); ok && !p.CaptureAtCompute() {
			return nil, errors.New("capture refused")
		}
		return p, nil
	case "backup":
		model, _ := transcript.Arg(args, "model")
		return nspb.NewBackup(model, list(args, "pfm"), list(args, "nfm"), 0, 0), nil
	case "gate":
		return nspb.NewReplyGate(), nil
	case "recovery":
		edges, err := edgesOf(args)
		if err != nil {
			return nil, err
		}
		st := map[string]bool{}
		for _, m := range list(args, "stateful") {
			st[m] = true
		}
		_, replay := transcript.Arg(args, "replay")
		return recovery.New(recovery.Config{Graph: recovery.NewGraphFromEdges(st, edges), Replay: replay})
	case "pool":
		v, _ := transcript.Arg(args, "redundancy")
		cfg := parity.Config{}
		switch v {
		case "none":
			cfg.Redundancy = parity.RedundancyNone
		case "er":
			cfg.Redundancy = parity.RedundancyER
		case "parm":
			cfg.Redundancy = parity.RedundancyParM
		default:
			return nil, fmt.Errorf("redundancy %q", v)
		}
		k, err1 := transcript.Uint(args, "k", 0)
		r, err2 := transcript.Uint(args, "r", 0)
		d, err3 := transcript.Uint(args, "data", 1)
		pi, err4 := transcript.Uint(args, "parity", 0)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return nil, err
		}
		cfg.Code, cfg.DataInstances, cfg.ParityInstances = parity.Code{K: int(k), R: int(r)}, int(d), int(pi)
		return parity.NewMachine(cfg)
	case "flow":
		edges, err := edgesOf(args)
		if err != nil {
			return nil, err
		}
		return &flow{Flow: lineage.NewFlow(), graph: (&config.Service{Edges: edges}).Graph()}, nil
	}
	return nil, fmt.Errorf("unknown machine kind %q", kind)
}

// flow is a lineage.Flow with the service graph its reads need.
type flow struct {
	*lineage.Flow
	graph *config.Graph
}

// edgesOf parses edges=from>to,from>to.
func edgesOf(args []string) ([][2]string, error) {
	var edges [][2]string
	for _, e := range list(args, "edges") {
		from, to, ok := strings.Cut(e, ">")
		if !ok {
			return nil, fmt.Errorf("edge %q: want from>to", e)
		}
		edges = append(edges, [2]string{from, to})
	}
	return edges, nil
}

// parseEventAt is parseEvent with its malformed-operand panics turned
// into errors (the caller names the transcript line).
func parseEventAt(m protocol.Machine, word string, args, more []string) (ev protocol.Event, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("malformed event: %v", p)
		}
	}()
	return parseEvent(m, word, args, more)
}

// parseEvent builds the event word with args for machine m; more holds
// the indented lines after the event's line.
func parseEvent(m protocol.Machine, word string, args, more []string) (protocol.Event, error) {
	u := func(key string) uint64 {
		n, err := transcript.Uint(args, key, 0)
		if err != nil {
			panic(err)
		}
		return n
	}
	has := func(key string) bool { _, ok := transcript.Arg(args, key); return ok }
	first := func() string {
		if len(args) == 0 {
			panic("missing operand")
		}
		return args[0]
	}
	switch m.(type) {
	case *nspb.Pipeline:
		b := u("batch")
		switch word {
		case "compute-started":
			return nspb.ComputeStarted{Batch: b}, nil
		case "computed":
			return nspb.Computed{Batch: b}, nil
		case "updated":
			return nspb.Updated{Batch: b}, nil
		case "copied":
			return nspb.Copied{Batch: b}, nil
		case "copy-lost":
			return nspb.CopyLost{Batch: b}, nil
		case "acked":
			return nspb.Acked{Batch: b}, nil
		case "copy-wanted":
			return nspb.CopyWanted{}, nil
		}
	case *nspb.Backup, *nspb.ReplyGate:
		switch word {
		case "snapshot":
			return nspb.SnapshotReceived{Snapshot: nspb.SnapshotMeta{BatchID: u("batch"), MaxSeq: u("maxseq"), Deps: seqs(args, "deps")}}, nil
		case "durable":
			return nspb.Durable{Model: first(), Seq: u("seq")}, nil
		case "reply-arrived":
			return nspb.ReplyArrived{ReqID: u("req"), Deps: seqs(args, "deps")}, nil
		case "reply-dropped":
			return nspb.ReplyDropped{ReqID: u("req")}, nil
		}
	case *parity.Machine:
		at := time.Duration(0)
		if v, ok := transcript.Arg(args, "at"); ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				return nil, err
			}
			at = d
		}
		b, g, j, in := parity.BatchID(u("batch")), parity.GroupID(u("group")), int(u("parity")), parity.Instance(u("inst"))
		switch word {
		case "submit":
			return parity.Submitted{Batch: b, Now: at}, nil
		case "encoded":
			return parity.ParityEncoded{Group: g, Parity: j, OK: !has("bad"), Now: at}, nil
		case "done":
			return parity.DataDone{Batch: b, Instance: in, Now: at}, nil
		case "fail":
			return parity.DataFailed{Batch: b, Instance: in, Retryable: has("retry"), Now: at}, nil
		case "pdone":
			return parity.ParityDone{Group: g, Parity: j, Instance: in, Now: at}, nil
		case "pfail":
			return parity.ParityFailed{Group: g, Parity: j, Instance: in, Retryable: has("retry"), Now: at}, nil
		case "decoded":
			var ps []int
			for _, s := range list(args, "parities") {
				var n int
				if _, err := fmt.Sscan(s, &n); err != nil {
					return nil, err
				}
				ps = append(ps, n)
			}
			return parity.GroupDecoded{Group: g, Parities: ps, OK: !has("bad"), Now: at}, nil
		case "cancel":
			return parity.Cancelled{Batch: b, Now: at}, nil
		case "tick":
			return parity.TimePassed{Now: at}, nil
		}
	case *flow:
		switch word {
		case "observed":
			// observed frontend:1>a:1,a:1>c:1 (pred:seq>model:seq)
			var lin []*hamsv1.LineageEntry
			for _, e := range list(args, "lineage") {
				from, to, ok := strings.Cut(e, ">")
				fm, fs, ok1 := strings.Cut(from, ":")
				tm, ts, ok2 := strings.Cut(to, ":")
				if !ok || !ok1 || !ok2 {
					return nil, fmt.Errorf("lineage entry %q: want pred:seq>model:seq", e)
				}
				var x hamsv1.LineageEntry
				x.PredModel, x.Model = fm, tm
				if _, err := fmt.Sscan(fs, &x.PredSeq); err != nil {
					return nil, err
				}
				if _, err := fmt.Sscan(ts, &x.Seq); err != nil {
					return nil, err
				}
				lin = append(lin, &x)
			}
			return lineage.Observed{Lineage: lin}, nil
		}
	case *recovery.Machine:
		var err error
		if v, ok := transcript.Arg(args, "err"); ok {
			err = errors.New(v)
		}
		switch word {
		case "topology":
			return topology(more)
		case "suspect":
			v, _ := transcript.Arg(args, "role")
			return recovery.Suspected{Component: first(), Role: role(v)}, nil
		case "maxseq":
			return recovery.MaxSeqAnswered{ID: recovery.ActionID(u("id")), MaxSeq: u("seq")}, nil
		case "summary":
			return recovery.SummaryAnswered{ID: recovery.ActionID(u("id")),
				Summary: recovery.Summary{MaxOut: u("maxout"), MaxIn: seqs(args, "maxin"), ConsumedBeyond: has("consumed-beyond")}}, nil
		case "query-failed":
			return recovery.QueryFailed{ID: recovery.ActionID(u("id")), Err: err}, nil
		case "done":
			return recovery.ActionDone{ID: recovery.ActionID(u("id")), Err: err}, nil
		case "alive-again":
			return recovery.AliveAgain{Component: first()}, nil
		case "spare-joined":
			return recovery.SpareJoined{Component: first()}, nil
		}
	}
	return nil, fmt.Errorf("unknown event %q for %T", word, m)
}

// topology parses placement lines "COMPONENT MODEL ROLE epoch=N [dead]"
// and "frontend ADDRESS" lines; a placement's sidecar address is its
// component id.
func topology(lines []string) (protocol.Event, error) {
	t := &hamsv1.Topology{}
	for _, l := range lines {
		f := strings.Fields(l)
		if f[0] == "frontend" && len(f) == 2 {
			t.Frontends = append(t.Frontends, f[1])
			continue
		}
		if len(f) < 4 {
			return nil, fmt.Errorf("placement %q: want COMPONENT MODEL ROLE epoch=N [dead]", l)
		}
		epoch, err := transcript.Uint(f[3:], "epoch", 1)
		if err != nil {
			return nil, err
		}
		_, dead := transcript.Arg(f[3:], "dead")
		t.Placements = append(t.Placements, &hamsv1.Placement{ComponentId: f[0], Model: f[1], Role: role(f[2]),
			Epoch: epoch, Alive: !dead, SidecarAddress: f[0]})
	}
	return recovery.TopologyChanged{Topology: t}, nil
}

func role(s string) hamsv1.Role {
	switch s {
	case "primary":
		return hamsv1.Role_ROLE_PRIMARY
	case "backup":
		return hamsv1.Role_ROLE_BACKUP
	case "active":
		return hamsv1.Role_ROLE_ACTIVE
	case "standby":
		return hamsv1.Role_ROLE_STANDBY
	}
	return hamsv1.Role_ROLE_UNSPECIFIED
}

func status(m protocol.Machine, args []string) string {
	switch m := m.(type) {
	case *flow:
		target, _ := transcript.Arg(args, "target")
		return fmt.Sprintf("prefixes(%s)=%s max(%s)=%d", target, seqString(m.Prefixes(m.graph, target)), target, m.MaxSeq(target))
	case *parity.Machine:
		d, p := m.QueueDepth()
		return fmt.Sprintf("pending=%d queued data=%d parity=%d", m.Pending(), d, p)
	case *nspb.Pipeline:
		c, u, cp, a, r := m.Progress()
		return fmt.Sprintf("computed=%d updated=%d copied=%d acked=%d released=%d", c, u, cp, a, r)
	case *nspb.Backup:
		b, s := m.Applied()
		out := fmt.Sprintf("applied batch=%d seq=%d pending=%v", b, s, m.Pending())
		if id, model, need, have, blocked := m.Blocker(); blocked && model != "" {
			out += fmt.Sprintf(" blocked: batch %d waits for %s durable %d (have %d)", id, model, need, have)
		} else if blocked {
			out += fmt.Sprintf(" blocked: batch %d missing", id)
		}
		return out
	case *nspb.ReplyGate:
		return fmt.Sprintf("held=%d", m.Held())
	case *recovery.Machine:
		return fmt.Sprintf("round=%d idle=%v consumed=%v", m.Round(), m.Idle(), m.Consumed())
	}
	return fmt.Sprintf("%T", m)
}

// seqString renders a model -> seq map sorted by model ("a:1,b:2").
func seqString(m map[string]uint64) string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	for i, k := range ks {
		ks[i] = fmt.Sprintf("%s:%d", k, m[k])
	}
	return strings.Join(ks, ",")
}

func list(args []string, key string) []string {
	v, _ := transcript.Arg(args, key)
	if v == "" || v == "-" {
		return nil
	}
	return strings.Split(v, ",")
}

// seqs parses key=a:1,b:2 into a map.
func seqs(args []string, key string) map[string]uint64 {
	out := map[string]uint64{}
	for _, kv := range list(args, key) {
		k, v, _ := strings.Cut(kv, ":")
		var n uint64
		if _, err := fmt.Sscan(v, &n); err != nil {
			panic(fmt.Sprintf("%s=%s: %v", key, kv, err))
		}
		out[k] = n
	}
	return out
}
