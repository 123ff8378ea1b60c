package parity

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A scenario is a transcript: each line is an event, followed by the
// actions the machine returns (indented with "  "). The driver half of
// the protocol (Decode -> Decoded, Encode -> Encoded) is explicit in the
// transcript, as a driver would report it.
//
// Events:
//
//	submit B            at T    (every event may end with "at 12ms")
//	done B dI           data instance I answered batch B
//	fail B dI [retry]   data instance I failed batch B (retry: retryable)
//	encoded G pJ [bad]
//	pdone G pJ pI       parity instance I answered parity J of group G
//	pfail G pJ pI
//	decoded G [bad]     the driver's decode of G's outstanding Decode
//	cancel B
//	tick
func runScenario(t *testing.T, cfg Config, script string) string {
	t.Helper()
	m, err := NewMachine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	var lastDecode Action
	for _, line := range strings.Split(strings.TrimSpace(script), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		now := time.Duration(0)
		if n := len(f); n >= 2 && f[n-2] == "at" {
			d, err := time.ParseDuration(f[n-1])
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			now, f = d, f[:n-2]
		}
		num := func(i int) uint64 {
			v, err := strconv.ParseUint(strings.TrimLeft(f[i], "bgdp"), 10, 64)
			if err != nil {
				t.Fatalf("%q: field %d: %v", line, i, err)
			}
			return v
		}
		has := func(w string) bool { return f[len(f)-1] == w }
		var acts []Action
		switch f[0] {
		case "submit":
			acts = m.Submit(BatchID(num(1)), now)
		case "done":
			acts = m.DataDone(BatchID(num(1)), Instance(num(2)), now)
		case "fail":
			acts = m.DataFailed(BatchID(num(1)), Instance(num(2)), has("retry"), now)
		case "encoded":
			acts = m.Encoded(GroupID(num(1)), int(num(2)), !has("bad"), now)
		case "pdone":
			acts = m.ParityDone(GroupID(num(1)), int(num(2)), Instance(num(3)), now)
		case "pfail":
			acts = m.ParityFailed(GroupID(num(1)), int(num(2)), Instance(num(3)), false, now)
		case "decoded":
			acts = m.Decoded(GroupID(num(1)), lastDecode.Parities, !has("bad"), now)
		case "cancel":
			acts = m.Cancel(BatchID(num(1)), now)
		case "tick":
			acts = m.Tick(now)
		default:
			t.Fatalf("unknown event %q", line)
		}
		fmt.Fprintln(&out, line)
		for _, a := range acts {
			if a.Kind == ActDecode {
				lastDecode = a
			}
			fmt.Fprintf(&out, "  %s\n", a)
		}
	}
	return out.String()
}

func parm(k, r, data, par int) Config {
	return Config{Redundancy: RedundancyParM, Code: Code{K: k, R: r}, DataInstances: data, ParityInstances: par}
}

// scenario runs the events of want (its lines without extra indentation)
// and compares the whole transcript (actions indented by two spaces).
func scenario(t *testing.T, cfg Config, want string) {
	t.Helper()
	lines := dedent(want)
	var events []string
	for _, l := range lines {
		if !strings.HasPrefix(l, " ") {
			events = append(events, l)
		}
	}
	got := strings.Split(strings.TrimSpace(runScenario(t, cfg, strings.Join(events, "\n"))), "\n")
	if strings.Join(got, "\n") != strings.Join(lines, "\n") {
		t.Errorf("transcript differs\n--- got\n%s\n--- want\n%s", strings.Join(got, "\n"), strings.Join(lines, "\n"))
	}
}

// dedent removes the indentation of the literal's first line from every
// line and drops blank ones.
func dedent(s string) []string {
	var base string
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if base == "" {
			base = l[:len(l)-len(strings.TrimLeft(l, " \t"))]
		}
		out = append(out, strings.TrimRight(strings.TrimPrefix(l, base), " \t"))
	}
	return out
}

// Every original arrives, out of order, before the parity: no
// reconstruction, the queued parity is dropped once nothing needs it.
func TestScenarioOutOfOrderCompletion(t *testing.T) {
	scenario(t, parm(2, 1, 4, 1), `
	submit 1
	  run-data b1 on d0
	submit 2
	  run-data b2 on d1
	  encode g1 p0 of [1 2]
	submit 3
	  run-data b3 on d2
	encoded 1 p0
	  run-parity g1 p0 on p0
	done 2 d1
	  release b2
	done 1 d0
	  release b1
	  forget g1
	pdone 1 p0 p0
	`)
}

// The parity model is the slowest: both originals are released as they
// come; a group whose data outputs all arrive sends no approximate reply.
func TestScenarioParitySlowest(t *testing.T) {
	scenario(t, parm(2, 1, 2, 1), `
	submit 1
	  run-data b1 on d0
	submit 2
	  run-data b2 on d1
	  encode g1 p0 of [1 2]
	submit 3
	submit 4
	  encode g2 p0 of [3 4]
	encoded 1 p0
	  run-parity g1 p0 on p0
	encoded 2 p0
	done 1 d0
	  release b1
	  run-data b3 on d0
	done 2 d1
	  release b2
	  forget g1
	  run-data b4 on d1
	done 3 d0
	  release b3
	done 4 d1
	  release b4
	  drop-parity g2 p0
	  forget g2
	pdone 1 p0 p0
	`)
}

// A straggler: its group's other original and the parity are in, the
// missing output is reconstructed at once (first-k), the late original
// is compared, never released.
func TestScenarioStragglerReconstructedLateOriginal(t *testing.T) {
	scenario(t, parm(2, 1, 4, 1), `
	submit 1
	  run-data b1 on d0
	submit 2
	  run-data b2 on d1
	  encode g1 p0 of [1 2]
	encoded 1 p0
	  run-parity g1 p0 on p0
	done 2 d1
	  release b2
	pdone 1 p0 p0
	  decode g1 missing [1] from parities [0]
	decoded 1
	  release-decoded b1
	done 1 d0
	  compare b1
	  forget g1
	`)
}

// Two originals missing with r = 1: nothing decodes, the originals are
// awaited; once one arrives the other is reconstructed.
func TestScenarioTwoMissingR1(t *testing.T) {
	scenario(t, parm(3, 1, 3, 1), `
	submit 1
	  run-data b1 on d0
	submit 2
	  run-data b2 on d1
	submit 3
	  run-data b3 on d2
	  encode g1 p0 of [1 2 3]
	encoded 1 p0
	  run-parity g1 p0 on p0
	pdone 1 p0 p0
	done 3 d2
	  release b3
	done 1 d0
	  release b1
	  decode g1 missing [2] from parities [0]
	decoded 1
	  release-decoded b2
	`)
}

// With r = 2, two missing originals are reconstructed together.
func TestScenarioTwoMissingR2(t *testing.T) {
	scenario(t, parm(2, 2, 2, 2), `
	submit 1
	  run-data b1 on d0
	submit 2
	  run-data b2 on d1
	  encode g1 p0 of [1 2]
	  encode g1 p1 of [1 2]
	encoded 1 p0
	  run-parity g1 p0 on p0
	encoded 1 p1
	  run-parity g1 p1 on p1
	pdone 1 p0 p0
	pdone 1 p1 p1
	  decode g1 missing [1 2] from parities [0 1]
	decoded 1
	  release-decoded b1
	  release-decoded b2
	`)
}

// One data instance: the second batch of the group is still queued when
// its reconstruction is released: it is withdrawn, never run.
func TestScenarioWithdrawnBatch(t *testing.T) {
	scenario(t, parm(2, 1, 1, 1), `
	submit 1
	  run-data b1 on d0
	submit 2
	  encode g1 p0 of [1 2]
	encoded 1 p0
	  run-parity g1 p0 on p0
	pdone 1 p0 p0
	done 1 d0
	  release b1
	  decode g1 missing [2] from parities [0]
	decoded 1
	  release-decoded b2
	  withdraw b2
	  forget g1
	`)
}

// decode_after: the reconstruction waits; it is released when the delay
// expires, and not at all when the original comes in time.
func TestScenarioDecodeAfter(t *testing.T) {
	cfg := parm(2, 1, 2, 1)
	cfg.DecodeAfter = 10 * time.Millisecond
	t.Run("expires", func(t *testing.T) {
		scenario(t, cfg, `
		submit 1
		  run-data b1 on d0
		submit 2
		  run-data b2 on d1
		  encode g1 p0 of [1 2]
		encoded 1 p0
		  run-parity g1 p0 on p0
		done 2 d1 at 3ms
		  release b2
		pdone 1 p0 p0 at 5ms
		tick at 14ms
		tick at 15ms
		  decode g1 missing [1] from parities [0]
		decoded 1 at 15ms
		  release-decoded b1
		`)
		m, _ := NewMachine(cfg)
		m.Submit(1, 0)
		m.Submit(2, 0)
		m.Encoded(1, 0, true, 0)
		m.DataDone(2, 1, 3*time.Millisecond)
		m.ParityDone(1, 0, 0, 5*time.Millisecond)
		if d, ok := m.NextDeadline(5 * time.Millisecond); !ok || d != 15*time.Millisecond {
			t.Errorf("NextDeadline = %v, %v; want 15ms (decodable at 5ms + 10ms)", d, ok)
		}
	})
	t.Run("original in time", func(t *testing.T) {
		scenario(t, cfg, `
		submit 1
		  run-data b1 on d0
		submit 2
		  run-data b2 on d1
		  encode g1 p0 of [1 2]
		encoded 1 p0
		  run-parity g1 p0 on p0
		done 2 d1 at 3ms
		  release b2
		pdone 1 p0 p0 at 5ms
		done 1 d0 at 12ms
		  release b1
		  forget g1
		tick at 30ms
		`)
	})
}

// A parity backend error costs the reconstruction only: the straggler's
// original is awaited and released.
func TestScenarioParityError(t *testing.T) {
	scenario(t, parm(2, 1, 2, 1), `
	submit 1
	  run-data b1 on d0
	submit 2
	  run-data b2 on d1
	  encode g1 p0 of [1 2]
	encoded 1 p0
	  run-parity g1 p0 on p0
	done 2 d1
	  release b2
	pfail 1 p0 p0
	done 1 d0
	  release b1
	  forget g1
	`)
}

// A parity output that does not fit (the driver's decode refuses it) is a
// failed parity: no approximate reply, the original is awaited.
func TestScenarioParityGarbage(t *testing.T) {
	scenario(t, parm(2, 1, 2, 1), `
	submit 1
	  run-data b1 on d0
	submit 2
	  run-data b2 on d1
	  encode g1 p0 of [1 2]
	encoded 1 p0
	  run-parity g1 p0 on p0
	done 2 d1
	  release b2
	pdone 1 p0 p0
	  decode g1 missing [1] from parities [0]
	decoded 1 bad
	done 1 d0
	  release b1
	  forget g1
	`)
}

// A data batch that fails on every attempt is reconstructed when its group
// can; when the parity fails too, it fails.
func TestScenarioDataFailure(t *testing.T) {
	cfg := parm(2, 1, 2, 1)
	cfg.MaxAttempts = 2
	t.Run("reconstructed", func(t *testing.T) {
		scenario(t, cfg, `
		submit 1
		  run-data b1 on d0
		submit 2
		  run-data b2 on d1
		  encode g1 p0 of [1 2]
		encoded 1 p0
		  run-parity g1 p0 on p0
		fail 1 d0 retry
		done 2 d1
		  release b2
		  run-data b1 on d1
		fail 1 d1 retry at 1ms
		pdone 1 p0 p0 at 2ms
		  decode g1 missing [1] from parities [0]
		decoded 1 at 2ms
		  release-decoded b1
		  forget g1
		`)
	})
	t.Run("parity fails too", func(t *testing.T) {
		scenario(t, cfg, `
		submit 1
		  run-data b1 on d0
		submit 2
		  run-data b2 on d1
		  encode g1 p0 of [1 2]
		encoded 1 p0
		  run-parity g1 p0 on p0
		done 2 d1
		  release b2
		fail 1 d0 retry
		  run-data b1 on d1
		fail 1 d1 retry
		pfail 1 p0 p0
		  fail b1
		  forget g1
		`)
	})
	t.Run("invalid request is not reconstructed", func(t *testing.T) {
		scenario(t, cfg, `
		submit 1
		  run-data b1 on d0
		submit 2
		  run-data b2 on d1
		  encode g1 p0 of [1 2]
		encoded 1 p0
		  run-parity g1 p0 on p0
		fail 1 d0
		  fail b1
		done 2 d1
		  release b2
		  forget g1
		`)
	})
}

// Hedging: a batch running past the delay is run again on an idle copy;
// the first answer wins and the other is ignored.
func TestScenarioHedge(t *testing.T) {
	cfg := Config{Redundancy: RedundancyHedge, DataInstances: 2, HedgeAfter: 10 * time.Millisecond}
	scenario(t, cfg, `
	submit 1
	  run-data b1 on d0
	tick at 9ms
	tick at 10ms
	  run-data b1 on d1 (hedge)
	done 1 d1 at 12ms
	  release b1
	done 1 d0 at 50ms
	submit 2 at 51ms
	  run-data b2 on d1
	`)
}

// Light traffic spreads over every instance: the one idle the longest
// takes the next batch (a straggler is not picked every time it is idle).
func TestScenarioIdleLongestFirst(t *testing.T) {
	scenario(t, Config{Redundancy: RedundancyNone, DataInstances: 3}, `
	submit 1
	  run-data b1 on d0
	done 1 d0
	  release b1
	submit 2
	  run-data b2 on d1
	done 2 d1
	  release b2
	submit 3
	  run-data b3 on d2
	done 3 d2
	  release b3
	submit 4
	  run-data b4 on d0
	`)
}

// A cancelled batch still queued is withdrawn.
func TestScenarioCancel(t *testing.T) {
	scenario(t, Config{Redundancy: RedundancyER, DataInstances: 1}, `
	submit 1
	  run-data b1 on d0
	submit 2
	cancel 2
	  withdraw b2
	done 1 d0
	  release b1
	`)
}

// Random event orders: every batch gets exactly one answer, originals are
// released unless reconstructed, and the machine forgets everything.
func TestMachineRandomized(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 7))
		k := 2 + rng.IntN(3)
		r := 1 + rng.IntN(2)
		cfg := parm(k, r, 1+rng.IntN(4), r+rng.IntN(2))
		cfg.DecodeAfter = time.Duration(rng.IntN(3)) * time.Millisecond
		if seed%3 == 1 {
			cfg.FillAfter = time.Duration(1+rng.IntN(3)) * time.Millisecond
		}
		if seed%5 == 0 {
			cfg = Config{Redundancy: RedundancyHedge, DataInstances: 1 + rng.IntN(3), HedgeAfter: time.Millisecond}
		}
		m, err := NewMachine(cfg)
		if err != nil {
			t.Fatal(err)
		}
		type run struct {
			b    BatchID
			inst Instance
		}
		type prun struct {
			g    GroupID
			j    int
			inst Instance
		}
		var running []run
		var pruns []prun
		var encs, decs []Action
		answers := map[BatchID]int{}
		approx := map[BatchID]bool{}
		now := time.Duration(0)
		next := BatchID(1)
		n := 10 + rng.IntN(40)
		apply := func(acts []Action) {
			for _, a := range acts {
				switch a.Kind {
				case ActRunData:
					running = append(running, run{a.Batch, a.Instance})
				case ActEncode:
					encs = append(encs, a)
				case ActRunParity:
					pruns = append(pruns, prun{a.Group, a.Parity, a.Instance})
				case ActDecode:
					decs = append(decs, a)
				case ActRelease, ActFail:
					answers[a.Batch]++
				case ActReleaseDecoded:
					answers[a.Batch]++
					approx[a.Batch] = true
				}
			}
		}
		for steps := 0; steps < 10000; steps++ {
			now += time.Duration(rng.IntN(2)) * time.Millisecond
			var acts []Action
			switch c := rng.IntN(7); {
			case c == 0 && int(next) <= n:
				acts = m.Submit(next, now)
				next++
			case c == 1 && len(running) > 0:
				i := rng.IntN(len(running))
				x := running[i]
				running = append(running[:i], running[i+1:]...)
				if rng.IntN(8) == 0 {
					acts = m.DataFailed(x.b, x.inst, rng.IntN(2) == 0, now)
				} else {
					acts = m.DataDone(x.b, x.inst, now)
				}
			case c == 2 && len(encs) > 0:
				e := encs[0]
				encs = encs[1:]
				acts = m.Encoded(e.Group, e.Parity, rng.IntN(10) > 0, now)
			case c == 3 && len(pruns) > 0:
				i := rng.IntN(len(pruns))
				x := pruns[i]
				pruns = append(pruns[:i], pruns[i+1:]...)
				if rng.IntN(6) == 0 {
					acts = m.ParityFailed(x.g, x.j, x.inst, false, now)
				} else {
					acts = m.ParityDone(x.g, x.j, x.inst, now)
				}
			case c == 4 && len(decs) > 0:
				d := decs[0]
				decs = decs[1:]
				acts = m.Decoded(d.Group, d.Parities, rng.IntN(10) > 0, now)
			default:
				now += time.Millisecond
				acts = m.Tick(now)
			}
			apply(acts)
			if int(next) > n && len(running) == 0 && len(encs) == 0 && len(pruns) == 0 && len(decs) == 0 {
				break
			}
		}
		// Drain: every remaining event delivered.
		for guard := 0; len(running)+len(encs)+len(pruns)+len(decs) > 0 || m.Pending() > 0 && guard < 100; guard++ {
			switch {
			case len(running)+len(encs)+len(pruns)+len(decs) == 0:
				now += time.Second // a resting instance takes work again
				apply(m.Tick(now))
			case len(running) > 0:
				x := running[0]
				running = running[1:]
				apply(m.DataDone(x.b, x.inst, now))
			case len(encs) > 0:
				e := encs[0]
				encs = encs[1:]
				apply(m.Encoded(e.Group, e.Parity, true, now))
			case len(pruns) > 0:
				x := pruns[0]
				pruns = pruns[1:]
				apply(m.ParityDone(x.g, x.j, x.inst, now))
			default:
				d := decs[0]
				decs = decs[1:]
				apply(m.Decoded(d.Group, d.Parities, true, now))
			}
		}
		for b := BatchID(1); b < next; b++ {
			// A batch of a group left unfilled at the end has its original
			// (no parity ever comes); all others are answered once.
			if answers[b] != 1 {
				t.Fatalf("seed %d (%+v): batch %d answered %d times", seed, cfg, b, answers[b])
			}
		}
		if m.Pending() != 0 {
			t.Fatalf("seed %d: %d batches pending after every event", seed, m.Pending())
		}
		apply(m.Tick(now + time.Hour))
		if cfg.Redundancy == RedundancyParM && len(m.groups) > 1 {
			t.Fatalf("seed %d: %d groups kept after settling (at most the unfilled one)", seed, len(m.groups))
		}
		if cfg.Redundancy != RedundancyParM && len(approx) > 0 {
			t.Fatalf("seed %d: approximate replies without parity", seed)
		}
	}
}

func TestNewMachineValidates(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Redundancy: RedundancyNone}, "0 data instances"},
		{Config{Redundancy: RedundancyParM, Code: Code{K: 1, R: 1}, DataInstances: 2, ParityInstances: 1}, "k"},
		{Config{Redundancy: RedundancyParM, Code: Code{K: 2, R: 1}, DataInstances: 2}, "parity instances"},
		{Config{Redundancy: RedundancyHedge, DataInstances: 2, HedgeAfter: -1}, "negative"},
	} {
		_, err := NewMachine(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewMachine(%+v) = %v, want an error naming %q", c.cfg, err, c.want)
		}
	}
}

// A deadline that passed while the driver handled other events is still
// reported (the driver ticks at once), so a decode_after never gets lost.
func TestNextDeadlinePassedIsReported(t *testing.T) {
	cfg := parm(2, 1, 2, 1)
	cfg.DecodeAfter = 5 * time.Millisecond
	m, _ := NewMachine(cfg)
	m.Submit(1, 0)
	m.Submit(2, 0)
	m.Encoded(1, 0, true, 0)
	m.DataDone(2, 1, time.Millisecond)
	m.ParityDone(1, 0, 0, time.Millisecond)
	if d, ok := m.NextDeadline(20 * time.Millisecond); !ok || d != 6*time.Millisecond {
		t.Fatalf("NextDeadline(20ms) = %v, %v; want the passed 6ms", d, ok)
	}
	acts := m.Tick(20 * time.Millisecond)
	if len(acts) != 1 || acts[0].Kind != ActDecode {
		t.Fatalf("Tick after the deadline: %v, want a decode", acts)
	}
}

// Light load: a group still short of members after fill_after is closed
// with a stand-in (a recently answered batch); the straggler of the group
// is then reconstructed from it and the parity.
func TestScenarioFillAfter(t *testing.T) {
	cfg := parm(2, 1, 2, 1)
	cfg.FillAfter = 3 * time.Millisecond
	scenario(t, cfg, `
	submit 1
	  run-data b1 on d0
	submit 2 at 1ms
	  run-data b2 on d1
	  encode g1 p0 of [1 2]
	encoded 1 p0 at 1ms
	  run-parity g1 p0 on p0
	done 1 d0 at 2ms
	  release b1
	done 2 d1 at 2ms
	  release b2
	  forget g1
	pdone 1 p0 p0 at 2ms
	submit 3 at 10ms
	  run-data b3 on d0
	tick at 12ms
	tick at 13ms
	  encode g2 p0 of [3] and 1 stand-ins
	encoded 2 p0 at 13ms
	  run-parity g2 p0 on p0
	pdone 2 p0 p0 at 14ms
	  decode g2 missing [3] from parities [0]
	decoded 2 at 14ms
	  release-decoded b3
	done 3 d0 at 60ms
	  compare b3
	  forget g2
	`)
}
