package consistency

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hams-go/hams/internal/audit"
)

// dg is a deterministic hex SHA-256 for a label.
func dg(label string) string {
	s := sha256.Sum256([]byte(label))
	return hex.EncodeToString(s[:])
}

// dur is a durable record of model m at seq with outputs named by label.
func dur(m string, seq uint64, out string) audit.Durable {
	return audit.Durable{Model: m, Seq: seq, InputDigest: dg("in-" + out), OutputDigest: dg(out), StateDigest: dg("state-" + out)}
}

func step(m string, seq uint64, out string) audit.LineageStep {
	return audit.LineageStep{Model: m, Seq: seq, OutputDigest: dg(out)}
}

func reply(id, digest string, steps ...audit.LineageStep) audit.Reply {
	return audit.Reply{ReqID: id, Lineage: steps, ReplyDigest: dg(digest)}
}

// clean is a consistent run: stateful lstm (seqs 1..3) after stateless
// prep, and stateful olearn (seqs 1..3); requests 1..3.
func clean() (map[string][]audit.Durable, map[string][]audit.Reply, []Accepted) {
	durable := map[string][]audit.Durable{
		// The first backup of lstm wrote 1..2, then died; the successor of the
		// promoted backup wrote 2..3 (2 again, identical).
		"lstm-backup":          {dur("lstm", 1, "l1"), dur("lstm", 2, "l2")},
		"run2/lstm-backup":     {dur("lstm", 2, "l2"), dur("lstm", 3, "l3")},
		"deep/a/olearn-backup": {dur("olearn", 1, "o1"), dur("olearn", 2, "o2"), dur("olearn", 3, "o3")},
	}
	replies := map[string][]audit.Reply{
		"frontend": {
			reply("1", "r1", step("prep", 1, "p1"), step("lstm", 1, "l1"), step("olearn", 1, "o1")),
			reply("2", "r2", step("prep", 2, "p2"), step("lstm", 2, "l2"), step("olearn", 2, "o2")),
		},
		"later/frontend": {
			reply("3", "r3", step("prep", 3, "p3"), step("lstm", 3, "l3"), step("olearn", 3, "o3")),
		},
	}
	accepted := []Accepted{
		{ReqID: "1", ClientRequestID: "c1", ReplyDigest: dg("r1")},
		{ReqID: "2", ClientRequestID: "c2"},
		{ReqID: "3"},
	}
	return durable, replies, accepted
}

// writeDir builds an audit dir with the internal/audit writers.
func writeDir(t *testing.T, durable map[string][]audit.Durable, replies map[string][]audit.Reply) string {
	t.Helper()
	dir := t.TempDir()
	write := func(sub, name string, recs []any) {
		l, err := audit.Open(dir, sub, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if err := l.Write(r); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for sub, recs := range durable {
		var rs []any
		for _, r := range recs {
			rs = append(rs, r)
		}
		write(sub, audit.DurableFile, rs)
	}
	for sub, recs := range replies {
		var rs []any
		for _, r := range recs {
			rs = append(rs, r)
		}
		write(sub, audit.RepliesFile, rs)
	}
	return dir
}

func TestCheck(t *testing.T) {
	type want struct {
		conflicts, lost, duplicates, notDurable, unmatched int
		kinds                                              map[string]int
		details                                            []string // substrings of example details, in order of Examples
	}
	cases := []struct {
		name   string
		mutate func(d map[string][]audit.Durable, r map[string][]audit.Reply, a *[]Accepted)
		opts   *Options // nil: Check (quiescent)
		want   want
	}{
		{
			name:   "clean",
			mutate: func(map[string][]audit.Durable, map[string][]audit.Reply, *[]Accepted) {},
			want:   want{kinds: map[string]int{}},
		},
		{
			name: "forked durable history",
			mutate: func(d map[string][]audit.Durable, _ map[string][]audit.Reply, _ *[]Accepted) {
				d["run2/lstm-backup"][0] = dur("lstm", 2, "l2-diverged")
			},
			want: want{conflicts: 1, kinds: map[string]int{KindForked: 1},
				details: []string{`model "lstm" seq 2: durable history forked: 2 different records: lstm-backup/durable.jsonl:2 vs run2/lstm-backup/durable.jsonl:1: input_digest ` +
					dg("in-l2")[:12] + "/" + dg("in-l2-diverged")[:12] + ", output_digest " + dg("l2")[:12] + "/" + dg("l2-diverged")[:12] +
					", state_digest " + dg("state-l2")[:12] + "/" + dg("state-l2-diverged")[:12]}},
		},
		{
			name: "forked state only",
			mutate: func(d map[string][]audit.Durable, _ map[string][]audit.Reply, _ *[]Accepted) {
				d["run2/lstm-backup"][0].StateDigest = dg("other")
			},
			want: want{conflicts: 1, kinds: map[string]int{KindForked: 1},
				details: []string{"run2/lstm-backup/durable.jsonl:1: state_digest " + dg("state-l2")[:12] + "/" + dg("other")[:12]}},
		},
		{
			name: "reply output not in durable history",
			mutate: func(_ map[string][]audit.Durable, r map[string][]audit.Reply, _ *[]Accepted) {
				r["frontend"][1].Lineage[2] = step("olearn", 2, "o2-replayed")
			},
			want: want{conflicts: 1, kinds: map[string]int{KindNotInHistory: 1},
				details: []string{`req_id 2: reply's output at model "olearn" seq 2 is ` + dg("o2-replayed")[:12] + ", the durable history has " + dg("o2")[:12]}},
		},
		{
			name: "reply names a non-durable seq (quiescent)",
			mutate: func(_ map[string][]audit.Durable, r map[string][]audit.Reply, a *[]Accepted) {
				r["frontend"] = append(r["frontend"], reply("4", "r4", step("prep", 4, "p4"), step("lstm", 4, "l4"), step("olearn", 4, "o4")))
				*a = append(*a, Accepted{ReqID: "4", ClientRequestID: "c4"})
			},
			want: want{conflicts: 2, notDurable: 2, kinds: map[string]int{KindNotDurable: 2},
				details: []string{`req_id 4: reply names model "lstm" seq 4 (output ` + dg("l4")[:12] + "), which has no durable record",
					`req_id 4: reply names model "olearn" seq 4`}},
		},
		{
			name: "reply names a non-durable seq (not quiescent)",
			mutate: func(_ map[string][]audit.Durable, r map[string][]audit.Reply, _ *[]Accepted) {
				r["frontend"] = append(r["frontend"], reply("4", "r4", step("lstm", 4, "l4")))
			},
			opts: &Options{},
			want: want{notDurable: 1, unmatched: 1, kinds: map[string]int{KindNotDurable: 1},
				details: []string{`req_id 4: reply names model "lstm" seq 4`}},
		},
		{
			name: "model declared stateful without durable records",
			mutate: func(_ map[string][]audit.Durable, r map[string][]audit.Reply, _ *[]Accepted) {
				r["frontend"][0].Lineage = append(r["frontend"][0].Lineage, step("knn", 1, "k1"))
			},
			opts: &Options{Quiescent: true, Stateful: []string{"knn", "lstm"}},
			want: want{conflicts: 1, notDurable: 1, kinds: map[string]int{KindNotDurable: 1},
				details: []string{`req_id 1: reply names model "knn" seq 1`}},
		},
		{
			name: "two different replies for one request",
			mutate: func(_ map[string][]audit.Durable, r map[string][]audit.Reply, _ *[]Accepted) {
				r["later/frontend"] = append(r["later/frontend"], reply("2", "r2-other", step("prep", 2, "p2"), step("lstm", 2, "l2"), step("olearn", 2, "o2")))
			},
			want: want{conflicts: 1, kinds: map[string]int{KindReplyConflict: 1},
				details: []string{"req_id 2 answered with 2 different replies: " + dg("r2")[:12] + " vs " + dg("r2-other")[:12]}},
		},
		{
			name: "one stateful (model, seq) with two outputs across replies",
			mutate: func(_ map[string][]audit.Durable, r map[string][]audit.Reply, _ *[]Accepted) {
				// The same request recorded twice with the same reply, but its
				// lineage at lstm seq 3 differs.
				r["frontend"] = append(r["frontend"], reply("3", "r3", step("lstm", 3, "l3-other")))
			},
			want: want{conflicts: 2, duplicates: 1, kinds: map[string]int{KindDuplicate: 1, KindNotInHistory: 1, KindOutputConflict: 1},
				details: []string{
					"req_id 3 answered twice with the same reply " + dg("r3")[:12],
					`req_id 3: reply's output at model "lstm" seq 3 is ` + dg("l3-other")[:12],
					`model "lstm" seq 3 appears in replies with 2 different outputs: ` + dg("l3-other")[:12] + " vs " + dg("l3")[:12],
				}},
		},
		{
			name: "one stateful (model, seq) in replies to two requests",
			mutate: func(_ map[string][]audit.Durable, r map[string][]audit.Reply, a *[]Accepted) {
				r["frontend"] = append(r["frontend"], reply("5", "r5", step("lstm", 1, "l1")))
				*a = append(*a, Accepted{ReqID: "5"})
			},
			want: want{conflicts: 1, kinds: map[string]int{KindSeqShared: 1},
				details: []string{`model "lstm" seq 1 appears in replies to 2 different requests: req_ids 1, 5`}},
		},
		{
			name: "lost requests",
			mutate: func(_ map[string][]audit.Durable, _ map[string][]audit.Reply, a *[]Accepted) {
				*a = append(*a,
					Accepted{ReqID: "7", ClientRequestID: "c7"}, // client got a reply the frontend did not record
					Accepted{ClientRequestID: "c8"},             // client never got a reply
					Accepted{ReqID: "9"},                        // req_id only
					// c2 retried: one attempt unanswered, one answered: not lost.
					Accepted{ClientRequestID: "c2"},
				)
			},
			want: want{lost: 3, kinds: map[string]int{KindLost: 3},
				details: []string{
					`client request "c7": accepted, no reply record for req_id 7`,
					`client request "c8": accepted, the client received no reply`,
					"req_id 9: accepted, no reply record",
				}},
		},
		{
			name: "duplicate identical replies",
			mutate: func(_ map[string][]audit.Durable, r map[string][]audit.Reply, _ *[]Accepted) {
				r["later/frontend"] = append(r["later/frontend"], r["frontend"][0], r["frontend"][0])
			},
			want: want{duplicates: 2, kinds: map[string]int{KindDuplicate: 2},
				details: []string{"req_id 1 answered twice with the same reply " + dg("r1")[:12], "req_id 1 answered twice"}},
		},
		{
			name: "client saw another reply",
			mutate: func(_ map[string][]audit.Durable, _ map[string][]audit.Reply, a *[]Accepted) {
				(*a)[1].ReplyDigest = dg("what-the-client-saw")
			},
			want: want{conflicts: 1, kinds: map[string]int{KindClientMismatch: 1},
				details: []string{`req_id 2 (client id "c2"): the client received reply ` + dg("what-the-client-saw")[:12] + ", the frontend recorded " + dg("r2")[:12]}},
		},
		{
			name: "unmatched replies are only counted",
			mutate: func(_ map[string][]audit.Durable, _ map[string][]audit.Reply, a *[]Accepted) {
				*a = (*a)[:1]
			},
			want: want{unmatched: 2, kinds: map[string]int{}},
		},
		{
			name: "no accepted list: nothing lost, nothing unmatched",
			mutate: func(_ map[string][]audit.Durable, _ map[string][]audit.Reply, a *[]Accepted) {
				*a = nil
			},
			want: want{kinds: map[string]int{}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, r, a := clean()
			tc.mutate(d, r, &a)
			dir := writeDir(t, d, r)
			var rep *Report
			var err error
			if tc.opts == nil {
				rep, err = Check(dir, a)
			} else {
				rep, err = CheckWith(dir, a, *tc.opts)
			}
			if err != nil {
				t.Fatal(err)
			}
			w := tc.want
			got := want{rep.Conflicts, rep.Lost, rep.Duplicates, rep.NotDurable, rep.Unmatched, rep.ByKind, nil}
			if got.conflicts != w.conflicts || got.lost != w.lost || got.duplicates != w.duplicates ||
				got.notDurable != w.notDurable || got.unmatched != w.unmatched || !maps.Equal(got.kinds, w.kinds) {
				t.Fatalf("counts: got %+v, want %+v\n%s", got, w, rep.Summary())
			}
			if len(rep.Examples) != len(w.details) {
				t.Fatalf("got %d examples, want %d:\n%s", len(rep.Examples), len(w.details), rep.Summary())
			}
			for i, sub := range w.details {
				if !strings.Contains(rep.Examples[i].Detail, sub) {
					t.Errorf("example %d: %q does not contain %q", i, rep.Examples[i].Detail, sub)
				}
			}
			if rep.OK() != (w.conflicts == 0 && w.lost == 0) {
				t.Errorf("OK() = %v", rep.OK())
			}
		})
	}
}

func TestCleanStats(t *testing.T) {
	d, r, a := clean()
	dir := writeDir(t, d, r)
	rep, err := Check(dir, a)
	if err != nil {
		t.Fatal(err)
	}
	if rep.DurableFiles != 3 || rep.ReplyFiles != 2 || rep.DurableRecords != 7 || rep.ReplyRecords != 3 ||
		rep.Replies != 3 || rep.Accepted != 3 || !rep.Quiescent {
		t.Fatalf("totals: %+v", rep)
	}
	if got := slices.Sorted(maps.Keys(rep.Models)); !slices.Equal(got, []string{"lstm", "olearn"}) {
		t.Fatalf("stateful models %v (prep is stateless)", got)
	}
	want := ModelStats{DurableRecords: 4, Seqs: 3, MinSeq: 1, MaxSeq: 3, Repeats: 1, ReplySteps: 3}
	if *rep.Models["lstm"] != want {
		t.Fatalf("lstm stats %+v, want %+v", *rep.Models["lstm"], want)
	}
	s := rep.Summary()
	for _, sub := range []string{"global consistency: CONSISTENT: conflicts 0, lost 0, duplicates 0",
		"model lstm: 4 durable records, 3 seqs (1..3, 0 missing, 1 repeated), 0 forks; 3 reply steps"} {
		if !strings.Contains(s, sub) {
			t.Errorf("summary lacks %q:\n%s", sub, s)
		}
	}
}

func TestMissingSeqs(t *testing.T) {
	d := map[string][]audit.Durable{"b": {dur("m", 2, "a"), dur("m", 5, "b")}}
	rep, err := Check(writeDir(t, d, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if st := rep.Models["m"]; st.MinSeq != 2 || st.MaxSeq != 5 || st.Missing != 3 || !rep.OK() {
		t.Fatalf("stats %+v", st)
	}
}

func TestExamplesBoundAndSummary(t *testing.T) {
	d, r, _ := clean()
	var acc []Accepted
	for _, id := range []string{"10", "11", "12"} {
		acc = append(acc, Accepted{ReqID: id})
	}
	dir := writeDir(t, d, r)
	rep, err := CheckWith(dir, acc, Options{Quiescent: true, MaxExamples: 1})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Lost != 3 || len(rep.Examples) != 1 || rep.ByKind[KindLost] != 3 {
		t.Fatalf("lost %d, examples %v", rep.Lost, rep.Examples)
	}
	s := rep.Summary()
	for _, sub := range []string{"VIOLATED: conflicts 0, lost 3", "  lost: 3\n    lost: req_id 10: accepted, no reply record\n    ... and 2 more\n"} {
		if !strings.Contains(s, sub) {
			t.Errorf("summary lacks %q:\n%s", sub, s)
		}
	}
	rep, err = CheckWith(dir, acc, Options{MaxExamples: -1})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Examples) != 3 {
		t.Fatalf("MaxExamples -1 kept %d examples", len(rep.Examples))
	}
}

// writeRaw writes raw bytes to dir/sub/name.
func writeRaw(t *testing.T, dir, sub, name, data string) {
	t.Helper()
	p := filepath.Join(dir, sub)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, name), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func line(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b) + "\n"
}

func TestMalformed(t *testing.T) {
	good := line(dur("m", 1, "x"))
	goodReply := line(reply("1", "r", step("m", 1, "x")))
	cases := []struct {
		name, file, data, want string
	}{
		{"not json", audit.DurableFile, good + "{nope\n" + good, "b/durable.jsonl:2: "},
		{"blank lines are skipped", audit.DurableFile, good + "\n  \n" + `{"model":""}` + "\n", "b/durable.jsonl:4: durable record without model"},
		{"no seq", audit.DurableFile, `{"model":"m","input_digest":"` + dg("a") + `"}` + "\n", "b/durable.jsonl:1: durable record without seq"},
		{"bad input digest", audit.DurableFile, line(audit.Durable{Model: "m", Seq: 1, InputDigest: "xyz", OutputDigest: dg("o"), StateDigest: dg("s")}), `input_digest "xyz" is not a hex SHA-256`},
		{"upper-case digest", audit.DurableFile, line(audit.Durable{Model: "m", Seq: 1, InputDigest: dg("i"), OutputDigest: strings.ToUpper(dg("o")), StateDigest: dg("s")}), "output_digest"},
		{"missing state digest", audit.DurableFile, line(audit.Durable{Model: "m", Seq: 1, InputDigest: dg("i"), OutputDigest: dg("o")}), `state_digest "" is not`},
		{"trailing data", audit.DurableFile, strings.TrimSuffix(good, "\n") + " {}\n" + good, "b/durable.jsonl:1: trailing data"},
		{"wrong type", audit.DurableFile, `{"model":"m","seq":"one"}` + "\n" + good, "b/durable.jsonl:1: "},
		{"reply without req_id", audit.RepliesFile, goodReply + line(reply("", "r")), "b/replies.jsonl:2: reply record without req_id"},
		{"reply digest", audit.RepliesFile, line(audit.Reply{ReqID: "1"}) + goodReply, `b/replies.jsonl:1: reply_digest "" is not`},
		{"step without model", audit.RepliesFile, line(reply("1", "r", step("", 1, "x"))) + goodReply, "lineage step 0 without model"},
		{"step without seq", audit.RepliesFile, line(reply("1", "r", step("m", 1, "x"), step("n", 0, "x"))) + goodReply, "lineage step 1 (n) without seq"},
		{"step digest", audit.RepliesFile, line(audit.Reply{ReqID: "1", ReplyDigest: dg("r"), Lineage: []audit.LineageStep{{Model: "m", Seq: 1}}}) + goodReply, "lineage step 0 (m) output_digest"},
		{"durable record in replies file", audit.RepliesFile, good + goodReply, "b/replies.jsonl:1: reply record without req_id"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeRaw(t, dir, "a", audit.DurableFile, good)
			writeRaw(t, dir, "b", tc.file, tc.data)
			_, err := Check(dir, nil)
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrMalformed containing %q", err, tc.want)
			}
		})
	}
}

func TestTornTail(t *testing.T) {
	dir := t.TempDir()
	full := line(dur("m", 1, "x"))
	writeRaw(t, dir, "b", audit.DurableFile, full+full[:20])
	// A complete final record without its newline is a record.
	writeRaw(t, dir, "f", audit.RepliesFile, strings.TrimSuffix(line(reply("1", "r", step("m", 1, "x"))), "\n"))
	rep, err := Check(dir, []Accepted{{ReqID: "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.TornLines, []string{"b/durable.jsonl:2"}) || rep.DurableRecords != 1 || rep.ReplyRecords != 1 || !rep.OK() {
		t.Fatalf("torn %v, records %d/%d\n%s", rep.TornLines, rep.DurableRecords, rep.ReplyRecords, rep.Summary())
	}
	if !strings.Contains(rep.Summary(), "skipped 1 crash-torn final lines: b/durable.jsonl:2") {
		t.Fatalf("summary:\n%s", rep.Summary())
	}
}

func TestBadInputs(t *testing.T) {
	empty := t.TempDir()
	writeRaw(t, empty, "x", "other.jsonl", "{}\n")
	if _, err := Check(empty, nil); !errors.Is(err, ErrNoAudit) {
		t.Fatalf("no audit files: err = %v", err)
	}
	if _, err := Check(filepath.Join(empty, "missing"), nil); err == nil || !strings.Contains(err.Error(), "read audit dir") {
		t.Fatalf("missing dir: err = %v", err)
	}
	if _, err := Check(filepath.Join(empty, "x", "other.jsonl"), nil); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("file as dir: err = %v", err)
	}
	d, r, _ := clean()
	dir := writeDir(t, d, r)
	if _, err := Check(dir, []Accepted{{}}); !errors.Is(err, ErrAccepted) || !strings.Contains(err.Error(), "entry 0") {
		t.Fatalf("empty accepted entry: err = %v", err)
	}
	if _, err := Check(dir, []Accepted{{ReqID: "1"}, {ClientRequestID: "c", ReplyDigest: dg("r")}}); !errors.Is(err, ErrAccepted) || !strings.Contains(err.Error(), "entry 1") {
		t.Fatalf("digest without req_id: err = %v", err)
	}
	unreadable := t.TempDir()
	writeRaw(t, unreadable, "a", audit.DurableFile, line(dur("m", 1, "x")))
	if err := os.Chmod(filepath.Join(unreadable, "a", audit.DurableFile), 0); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 { // root reads anything
		if _, err := Check(unreadable, nil); err == nil {
			t.Fatal("unreadable file accepted")
		}
	}
}

func TestWriteJSON(t *testing.T) {
	d, r, a := clean()
	a = append(a, Accepted{ClientRequestID: "lost"})
	rep, err := Check(writeDir(t, d, r), a)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "chaos.json")
	if err := WriteJSON(rep, p); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]float64{"conflicts": 0, "lost": 1, "duplicates": 0, "replies": 3} {
		if m[k] != want {
			t.Errorf("%s = %v, want %v", k, m[k], want)
		}
	}
	if models, _ := m["models"].(map[string]any); models["lstm"].(map[string]any)["max_seq"] != 3.0 {
		t.Errorf("models: %v", m["models"])
	}
	var back Report
	if err := json.Unmarshal(data, &back); err != nil || back.Lost != 1 || len(back.Examples) != 1 || back.Examples[0].Kind != KindLost {
		t.Fatalf("round trip: %v %+v", err, back)
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
	if err := WriteJSON(rep, filepath.Join(t.TempDir(), "no", "such", "dir.json")); err == nil {
		t.Error("write into a missing dir succeeded")
	}
	if err := WriteJSON(nil, p); err == nil {
		t.Error("nil report written")
	}
}

func TestReqIDOrder(t *testing.T) {
	ids := []string{"b", "10", "9", "a", "009", "100"}
	slices.SortFunc(ids, cmpReqID)
	if want := []string{"009", "9", "10", "100", "a", "b"}; !slices.Equal(ids, want) {
		t.Fatalf("order %v, want %v", ids, want)
	}
}
