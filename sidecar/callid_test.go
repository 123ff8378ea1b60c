package sidecar

import (
	"fmt"
	"testing"

	"github.com/hams-go/hams/adapters/tfserving"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/hamsmd"
	"github.com/hams-go/hams/internal/testing/backendtest"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
	"google.golang.org/grpc"
)

const identityGraph = `
name: t
mode: bare
models:
  - {name: a, kind: fake, batch: {size: 1}}
  - {name: b, kind: fake, batch: {size: 4, max_wait: 2ms}, backend: {type: tfserving, address: "x:1", model: tf_model}}
services:
  - name: s
    edges: [[frontend, a], [a, b], [b, frontend]]
`

// TestBackendCallsCarryIdentity: frontend -> a -> b, b behind the TF
// Serving adapter on a connection with hamsmd's interceptor. Every Predict
// at the backend carries, per row of its batch and in row order, the
// request's req_id and its lineage (a's entry, from the frontend); every
// request is named exactly once.
func TestBackendCallsCarryIdentity(t *testing.T) {
	bt, err := backendtest.Start("tf_model")
	if err != nil {
		t.Fatal(err)
	}
	defer bt.Stop()
	cc, err := grpcx.Dial(bt.Addr(), 0, grpc.WithChainUnaryInterceptor(hamsmd.UnaryClientInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	tb, err := tfserving.New(cc, tfserving.Config{Model: "tf_model"})
	if err != nil {
		t.Fatal(err)
	}
	h := startGraph(t, identityGraph, map[string]Backend{"a": &fakeBackend{inputs: []string{"x"}}, "b": tb})
	defer h.stop()
	const n = 40
	for id := uint64(1); id <= n; id++ {
		h.senders["a"].Send(&hamsv1.Item{ReqId: id, Service: "s", StreamId: fmt.Sprint("st", id), Tensors: []*hamsv1.Tensor{row(float32(id), 2)}})
	}
	waitFor(t, "replies", func() bool { return h.sink.count() >= n })
	seen := map[uint64]bool{}
	for _, c := range bt.Calls() {
		if c.Method != "Predict" {
			if id, _ := hamsmd.FromMD(c.MD); id != nil {
				t.Fatalf("%s carried identity %+v", c.Method, id)
			}
			continue
		}
		id, err := hamsmd.FromMD(c.MD)
		if err != nil || id == nil {
			t.Fatalf("Predict without identity: %v %v", c.MD, err)
		}
		rows := c.Req.(*tfapis.PredictRequest).GetInputs()["out"].GetTensorShape().GetDim()[0].GetSize()
		if int64(len(id.ReqIDs)) != rows || len(id.Lineages) != len(id.ReqIDs) || id.Truncated != 0 {
			t.Fatalf("batch of %d rows: identity %+v", rows, id)
		}
		for i, r := range id.ReqIDs {
			l := id.Lineages[i]
			if seen[r] || l.GetReqId() != r || l.GetModel() != "b" || l.GetService() != "s" || l.GetStreamId() != fmt.Sprint("st", r) {
				t.Fatalf("row %d: req_id %d, lineage %v (seen %v)", i, r, l, seen[r])
			}
			if len(l.GetLineage()) != 1 || l.GetLineage()[0].GetModel() != "a" || l.GetLineage()[0].GetPredModel() != config.Frontend ||
				l.GetLineage()[0].GetPredSeq() != r || l.GetLineage()[0].GetOutputDigest() != "" {
				t.Fatalf("row %d: lineage %v", i, l.GetLineage())
			}
			seen[r] = true
		}
	}
	if len(seen) != n {
		t.Fatalf("%d of %d requests named in backend metadata", len(seen), n)
	}
}
