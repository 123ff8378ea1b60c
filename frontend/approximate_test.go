package frontend

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/audit"
	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// approxMarker is the first element of an FP32 input that the fake
// ParM models of these tests "reconstruct" (markedInput).
const approxMarker = -42

// markedInput says whether an item carries an FP32 tensor whose first
// element is approxMarker: the requests the fake pools answer with a
// reconstruction.
func markedInput(it *hamsv1.Item) bool {
	for _, t := range it.GetTensors() {
		if t.GetDatatype() != "FP32" {
			continue
		}
		if v, err := tensor.Float32(t); err == nil && len(v) > 0 && v[0] == approxMarker {
			return true
		}
	}
	return false
}

// newApproxEnv is the test deployment (echo: frontend -> a; fan: sinks q,
// x, y) where a and q reconstruct marked inputs; p, x and y never do.
func newApproxEnv(t *testing.T, more func(*Config)) *env {
	t.Helper()
	return newEnvWith(t, envOpts{yaml: fmt.Sprintf(testYAML, "5s"), config: more,
		approx: map[string]func(*hamsv1.Item) bool{"a": markedInput, "q": markedInput}})
}

// fanInput is the one input of a fan request, marked or not.
func fanInput(marked bool) []*hamsv1.Tensor {
	first := float32(1)
	if marked {
		first = approxMarker
	}
	return []*hamsv1.Tensor{tensor.FromFloat32("v", []int64{1, 3}, []float32{first, 2, 3})}
}

func (e *env) approxCount(service string) float64 {
	e.t.Helper()
	return metricValue(e.t, e.fe.m.approximate.WithLabelValues(service))
}

// TestApproximateReplyOnOwnAPI: a reply is approximate exactly when one
// of its sink items is: one sink out of three suffices (fan, where only q
// reconstructs), an exact reply is not marked, a retry answered from the
// reply cache keeps the mark, and the counter counts the approximate
// answers only.
func TestApproximateReplyOnOwnAPI(t *testing.T) {
	e := newApproxEnv(t, nil)
	ctx := ctxT(t, 10*time.Second)
	for _, tc := range []struct {
		service string
		in      []*hamsv1.Tensor
		want    bool
	}{
		{"echo", echoInputs(2, 1), false},
		{"echo", echoInputs(2, approxMarker), true},
		{"fan", fanInput(false), false},
		{"fan", fanInput(true), true},
	} {
		resp, err := e.client.Predict(ctx, &hamsv1.PredictRequest{Service: tc.service, Inputs: tc.in})
		if err != nil {
			t.Fatalf("%s: %v", tc.service, err)
		}
		if resp.GetApproximate() != tc.want {
			t.Fatalf("%s (marked input %v): reply approximate = %v", tc.service, tc.want, resp.GetApproximate())
		}
		if tc.service == "fan" && len(resp.Outputs) != 3 {
			t.Fatalf("fan reply outputs %v", resp.Outputs)
		}
	}
	if got := e.approxCount("echo"); got != 1 {
		t.Fatalf("approximate replies of echo %v, want 1", got)
	}
	if got := e.approxCount("fan"); got != 1 {
		t.Fatalf("approximate replies of fan %v, want 1", got)
	}
	// Idempotent retries: the remembered answer keeps its mark (and is
	// counted again: the client got a second approximate answer), an
	// exact one stays exact.
	for _, tc := range []struct {
		id   string
		base float32
		want bool
	}{{"approx-1", approxMarker, true}, {"exact-1", 5, false}} {
		req := &hamsv1.PredictRequest{Service: "echo", RequestId: tc.id, Inputs: echoInputs(1, tc.base)}
		first, err := e.client.Predict(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := e.client.Predict(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if first.GetApproximate() != tc.want || !proto.Equal(first, again) {
			t.Fatalf("%s: first %v, retry %v; want approximate %v on both", tc.id, first, again, tc.want)
		}
	}
	if got := e.approxCount("echo"); got != 3 {
		t.Fatalf("approximate replies of echo after the retries %v, want 3", got)
	}
	if n := e.models["a"].executed.Load(); n != 4 {
		t.Fatalf("a executed %d times, want 4 (retries answered from the cache)", n)
	}
}

// TestApproximateReplyOnHTTP: "approximate": true in the JSON reply of an
// approximate reply, no such key in an exact one.
func TestApproximateReplyOnHTTP(t *testing.T) {
	e := newApproxEnv(t, nil)
	body := func(first float32) string {
		return fmt.Sprintf(`{"inputs":[{"name":"images","datatype":"FP32","shape":[1,4],"data":[%v,1,2,3]},
			{"name":"ids","datatype":"INT64","shape":[1],"data":[1]}]}`, first)
	}
	for _, tc := range []struct {
		first float32
		want  string
	}{{approxMarker, "true"}, {0.5, ""}} {
		code, b := e.do("POST", "/v1/services/echo:predict", body(tc.first))
		if code != http.StatusOK {
			t.Fatalf("POST: %d %s", code, b)
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(b, &fields); err != nil {
			t.Fatalf("reply %s: %v", b, err)
		}
		if got := string(fields["approximate"]); got != tc.want || fields["outputs"] == nil {
			t.Fatalf("input starting %v: reply %s: approximate %q, want %q", tc.first, b, got, tc.want)
		}
	}
	// A multi-sink reply with one reconstructed sink.
	code, b := e.do("POST", "/v1/services/fan:predict", fmt.Sprintf(`{"inputs":[{"name":"v","datatype":"FP32","shape":[1,2],"data":[%d,1]}]}`, approxMarker))
	if code != http.StatusOK || !bytes.Contains(b, []byte(`"approximate":true`)) {
		t.Fatalf("fan: %d %s", code, b)
	}
}

// TestApproximateReplyOnKServe: parameters["hams_approximate"] = bool true
// on an approximate ModelInferResponse, absent on an exact one.
func TestApproximateReplyOnKServe(t *testing.T) {
	e := newApproxEnv(t, nil)
	_, _, ks := e.compatClients()
	ctx := ctxT(t, 10*time.Second)
	for _, tc := range []struct {
		model string
		in    []*hamsv1.Tensor
		want  bool
	}{
		{"echo", echoInputs(2, approxMarker), true},
		{"echo", echoInputs(2, 1), false},
		{"fan", fanInput(true), true},
		{"fan", fanInput(false), false},
	} {
		req := &inference.ModelInferRequest{ModelName: tc.model}
		for _, x := range tc.in {
			req.Inputs = append(req.Inputs, wire.InferInput(x))
			req.RawInputContents = append(req.RawInputContents, x.Data)
		}
		resp, err := ks.ModelInfer(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", tc.model, err)
		}
		p, ok := resp.GetParameters()[ParamApproximate]
		if tc.want != ok || (ok && !p.GetBoolParam()) {
			t.Fatalf("%s (marked input %v): parameters %v", tc.model, tc.want, resp.GetParameters())
		}
		if ok {
			if _, isBool := p.GetParameterChoice().(*inference.InferParameter_BoolParam); !isBool {
				t.Fatalf("%s: %s is %T, want a bool parameter", tc.model, ParamApproximate, p.GetParameterChoice())
			}
		}
		if len(resp.Outputs) == 0 {
			t.Fatalf("%s: no outputs", tc.model)
		}
	}
}

// TestApproximateReplyOnTFServing: response header metadata
// hams-approximate: true on an approximate Predict reply, absent on an
// exact one.
func TestApproximateReplyOnTFServing(t *testing.T) {
	e := newApproxEnv(t, nil)
	tf, _, _ := e.compatClients()
	ctx := ctxT(t, 10*time.Second)
	for _, tc := range []struct {
		model string
		in    []*hamsv1.Tensor
		want  bool
	}{
		{"echo", echoInputs(2, approxMarker), true},
		{"echo", echoInputs(2, 1), false},
		{"fan", fanInput(true), true},
		{"fan", fanInput(false), false},
	} {
		req := &tfapis.PredictRequest{ModelSpec: tfSpec(tc.model), Inputs: map[string]*tfpb.TensorProto{}}
		for _, x := range tc.in {
			tp, err := wire.ToTensorProto(x)
			if err != nil {
				t.Fatal(err)
			}
			req.Inputs[x.Name] = tp
		}
		var header metadata.MD
		resp, err := tf.Predict(ctx, req, grpc.Header(&header))
		if err != nil {
			t.Fatalf("%s: %v", tc.model, err)
		}
		got := header.Get(HeaderApproximate)
		if tc.want && (len(got) != 1 || got[0] != "true") || !tc.want && len(got) != 0 {
			t.Fatalf("%s (marked input %v): header %s = %q", tc.model, tc.want, HeaderApproximate, got)
		}
		if len(resp.Outputs) == 0 {
			t.Fatalf("%s: no outputs", tc.model)
		}
	}
}

// auditLines reads the raw replies.jsonl records under dir by req_id.
func auditLines(t *testing.T, dir string) map[string]map[string]json.RawMessage {
	t.Helper()
	out := map[string]map[string]json.RawMessage{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != audit.RepliesFile {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if l == "" {
				continue
			}
			var rec map[string]json.RawMessage
			if err := json.Unmarshal([]byte(l), &rec); err != nil {
				return fmt.Errorf("%s: %q: %w", p, l, err)
			}
			var id string
			if err := json.Unmarshal(rec["req_id"], &id); err != nil {
				return fmt.Errorf("%s: req_id of %q: %w", p, l, err)
			}
			out[id] = rec
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkAuditMark checks the audit record of resp: the contract's fields,
// and "approximate": true exactly when the reply is approximate.
func checkAuditMark(t *testing.T, recs map[string]map[string]json.RawMessage, resp *hamsv1.PredictResponse) {
	t.Helper()
	id := strconv.FormatUint(resp.GetReqId(), 10)
	rec := recs[id]
	if rec == nil {
		t.Fatalf("no audit record of req_id %s", id)
	}
	for _, k := range []string{"req_id", "lineage", "reply_digest"} {
		if rec[k] == nil {
			t.Fatalf("audit record of req_id %s lacks %s", id, k)
		}
	}
	want := ""
	if resp.GetApproximate() {
		want = "true"
	}
	if got := string(rec["approximate"]); got != want {
		t.Fatalf("audit record of req_id %s (reply approximate %v): approximate %q, want %q", id, resp.GetApproximate(), got, want)
	}
}

// TestApproximateReplyInAudit: the replies.jsonl record of an approximate
// reply has "approximate": true, an exact one has no such key.
func TestApproximateReplyInAudit(t *testing.T) {
	dir := t.TempDir()
	e := newApproxEnv(t, func(c *Config) { c.AuditDir = dir })
	ctx := ctxT(t, 10*time.Second)
	var resps []*hamsv1.PredictResponse
	for _, req := range []*hamsv1.PredictRequest{
		{Service: "echo", Inputs: echoInputs(1, approxMarker)},
		{Service: "echo", Inputs: echoInputs(1, 2)},
		{Service: "fan", Inputs: fanInput(true)},
		{Service: "fan", Inputs: fanInput(false)},
	} {
		resp, err := e.client.Predict(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		resps = append(resps, resp)
	}
	if !resps[0].GetApproximate() || resps[1].GetApproximate() || !resps[2].GetApproximate() || resps[3].GetApproximate() {
		t.Fatalf("replies not marked as their inputs: %v", resps)
	}
	e.stop() // flushes the audit log
	recs := auditLines(t, dir)
	if len(recs) != len(resps) {
		t.Fatalf("%d audit records, want %d", len(recs), len(resps))
	}
	for _, resp := range resps {
		checkAuditMark(t, recs, resp)
	}
}

// TestApproximateReplyThroughRequestLog: with a request log, the answer
// the leader records keeps the mark: the follower that accepted the
// request releases it marked, the record in the log is marked, a retry on
// the leader (answered from the record) is marked, and the leader's audit
// record (written before the answer is recorded) is marked; an exact
// reply is marked nowhere.
func TestApproximateReplyThroughRequestLog(t *testing.T) {
	co := openLog(t)
	dir := t.TempDir()
	yaml := fmt.Sprintf(testYAML, "5s")
	e := newEnvWith(t, envOpts{yaml: yaml,
		config: func(c *Config) { c.Log = co; c.Name = "lead"; c.AuditDir = dir },
		approx: map[string]func(*hamsv1.Item) bool{"a": markedInput}})
	f2 := e.addFrontend(t, yaml, func(c *Config) { c.Log = co; c.Name = "follow"; c.AuditDir = dir })
	eventually(t, "leadership settled", func() bool { return e.fe.isLeader() && !f2.fe.isLeader() })
	for _, tc := range []struct {
		id   string
		base float32
		want bool
	}{{"log-approx", approxMarker, true}, {"log-exact", 4, false}} {
		req := &hamsv1.PredictRequest{Service: "echo", RequestId: tc.id, Inputs: echoInputs(1, tc.base)}
		resp, err := f2.client.Predict(ctxT(t, 5*time.Second), req)
		if err != nil {
			t.Fatalf("%s: %v", tc.id, err)
		}
		if resp.GetApproximate() != tc.want {
			t.Fatalf("%s: follower released approximate = %v, want %v", tc.id, resp.GetApproximate(), tc.want)
		}
		// The follower may release the record as NATS routes it, before
		// JetStream stored it.
		var rec *coord.LoggedReply
		eventually(t, tc.id+" answer recorded", func() bool {
			r, err := co.LookupReply(ctxT(t, 5*time.Second), resp.GetReqId())
			rec = r
			return err == nil
		})
		if rec.Response.GetApproximate() != tc.want {
			t.Fatalf("%s: recorded answer approximate = %v, want %v", tc.id, rec.Response.GetApproximate(), tc.want)
		}
		again, err := e.client.Predict(ctxT(t, 5*time.Second), req)
		if err != nil || !proto.Equal(again, resp) {
			t.Fatalf("%s: retry on the leader: %v %v, want %v", tc.id, again, err, resp)
		}
		// The leader audited the reply before recording it.
		checkAuditMark(t, auditLines(t, filepath.Join(dir, "lead")), resp)
	}
	if n := e.models["a"].executed.Load(); n != 2 {
		t.Fatalf("a executed %d times, want 2", n)
	}
}

// TestTableReplyApproximateWhenAnySinkIs: the table's reply is
// approximate when any one sink part is, exact when none is, and the mark
// follows the parts a rolled-back reply is rebuilt from (not sticky). The
// approximate part is neither the first nor the last in sink order, nor
// the last to arrive.
func TestTableReplyApproximateWhenAnySinkIs(t *testing.T) {
	tb := newTable()
	sinks := []string{"a", "b", "c"}
	approx := func(it *hamsv1.Item) *hamsv1.Item { it.Approximate = true; return it }
	exact := tb.add("s", "", sinks, t0.Add(time.Second))
	one := tb.add("s", "", sinks, t0.Add(time.Second))
	tb.deliver("b", sinkItem(exact, "b", 1))
	tb.deliver("a", sinkItem(exact, "a", 1))
	if _, c := tb.deliver("c", sinkItem(exact, "c", 1)); c == nil || c.resp.GetApproximate() {
		t.Fatalf("reply of exact parts: %+v", c)
	}
	tb.deliver("b", approx(sinkItem(one, "b", 2)))
	tb.deliver("a", sinkItem(one, "a", 2))
	_, c := tb.deliver("c", sinkItem(one, "c", 2))
	if c == nil || !c.resp.GetApproximate() {
		t.Fatalf("reply of exact parts and one approximate part: %+v", c)
	}
	// Rolled back: b's reconstruction is lost, its re-execution is exact.
	if again := tb.readd(c, map[string]*hamsv1.Item{"a": c.parts["a"], "c": c.parts["c"]}); again != nil {
		t.Fatalf("readd completed without b: %+v", again)
	}
	if _, c2 := tb.deliver("b", sinkItem(one, "b", 3)); c2 == nil || c2.resp.GetApproximate() {
		t.Fatalf("rebuilt reply of exact parts: %+v", c2)
	}
}
