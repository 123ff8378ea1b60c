package refserver

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
	"github.com/hams-go/hams/refserver/models"
)

const testYAML = `
name: t
hosts: [h1, h2]
limits: {max_message_bytes: 4194304}
models:
  - name: fashion
    kind: classifier
  - name: seq
    kind: lstm
    stateful: true
    params: {in_dim: 4, hidden: 8, streams: 64}
    placement: {primary: h1, backup: h2}
  - name: join
    kind: concat
  - name: norm
    kind: prep
    params: {in_dim: 3, labels: labels}
  - name: notserved
    kind: prep
services:
  - name: s
    edges: [[frontend, fashion], [fashion, seq], [seq, join], [join, norm], [norm, notserved], [notserved, frontend]]
`

type env struct {
	srv *Server
	cc  *grpc.ClientConn
	reg *prometheus.Registry
	rt  hamsv1.ModelRuntimeClient
	ks  inference.GRPCInferenceServiceClient
	tf  tfapis.PredictionServiceClient
	ms  tfapis.ModelServiceClient
}

func start(t *testing.T) *env {
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
	srv, err := New(Config{Deployment: d, Models: []string{"fashion", "seq", "join", "norm"}, GRPCListener: lis, Registry: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
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
	return &env{srv: srv, cc: cc, reg: reg, rt: hamsv1.NewModelRuntimeClient(cc), ks: inference.NewGRPCInferenceServiceClient(cc),
		tf: tfapis.NewPredictionServiceClient(cc), ms: tfapis.NewModelServiceClient(cc)}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// wantCode checks err's code and that its message names want.
func wantCode(t *testing.T, what string, err error, code codes.Code, want string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: got %v, want %v", what, err, code)
	}
	if want != "" && !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("%s: message %q does not name %q", what, status.Convert(err).Message(), want)
	}
}

func f32(name string, rows, w int, v float32) *hamsv1.Tensor {
	x := make([]float32, rows*w)
	for i := range x {
		x[i] = v + float32(i%7)*0.01
	}
	return tensor.FromFloat32(name, []int64{int64(rows), int64(w)}, x)
}

func TestTwoServersShareRegistry(t *testing.T) {
	d, _ := config.Parse([]byte(testYAML))
	reg := prometheus.NewRegistry()
	for _, m := range []string{"fashion", "seq"} {
		lis, _ := net.Listen("tcp", "127.0.0.1:0")
		defer lis.Close()
		if _, err := New(Config{Deployment: d, Models: []string{m}, GRPCListener: lis, Registry: reg}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNewValidates(t *testing.T) {
	d, _ := config.Parse([]byte(testYAML))
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	defer lis.Close()
	for name, c := range map[string]Config{
		"no deployment": {Models: []string{"fashion"}, GRPCListener: lis},
		"no models":     {Deployment: d, GRPCListener: lis},
		"no listener":   {Deployment: d, Models: []string{"fashion"}},
		"unknown":       {Deployment: d, Models: []string{"ghost"}, GRPCListener: lis},
		"twice":         {Deployment: d, Models: []string{"seq", "seq"}, GRPCListener: lis},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	bad, _ := config.Parse([]byte(strings.Replace(testYAML, "in_dim: 4,", "in_dim: -4,", 1)))
	if _, err := New(Config{Deployment: bad, Models: []string{"seq"}, GRPCListener: lis}); !errors.Is(err, models.ErrInvalidConfig) {
		t.Errorf("bad params: %v", err)
	}
}

func TestRuntime(t *testing.T) {
	e := start(t)
	ctx := ctxT(t)
	h, err := e.rt.Health(ctx, &hamsv1.HealthRequest{})
	if err != nil || !h.Live || !h.Ready {
		t.Fatal(h, err)
	}
	_, err = e.rt.Health(ctx, &hamsv1.HealthRequest{Model: "ghost"})
	wantCode(t, "health ghost", err, codes.NotFound, "ghost")
	_, err = e.rt.Describe(ctx, &hamsv1.DescribeRequest{Model: "notserved"})
	wantCode(t, "describe notserved", err, codes.NotFound, "notserved")
	d, err := e.rt.Describe(ctx, &hamsv1.DescribeRequest{Model: "seq"})
	if err != nil || !d.Stateful || d.StateBytes != 2*64*8*4+64*6*4 || d.Kind != "lstm" { // h, c, the stream table
		t.Fatal(d, err)
	}
	// stateless infer, two items
	r, err := e.rt.Infer(ctx, &hamsv1.BatchRequest{Model: "fashion", Inputs: []*hamsv1.Tensor{f32("images", 3, 784, 0.2)}, Rows: []uint32{1, 2}, BatchId: 1})
	if err != nil || len(r.Outputs) != 1 || r.Outputs[0].Shape[0] != 3 || r.Outputs[0].Shape[1] != 10 || len(r.Rows) != 2 {
		t.Fatal(r, err)
	}
	// bad inputs name the tensor, the server keeps serving
	_, err = e.rt.Infer(ctx, &hamsv1.BatchRequest{Model: "fashion", Inputs: []*hamsv1.Tensor{f32("images", 1, 783, 0)}})
	wantCode(t, "width", err, codes.InvalidArgument, "images")
	_, err = e.rt.Infer(ctx, &hamsv1.BatchRequest{Model: "fashion", Inputs: []*hamsv1.Tensor{tensor.FromInt64("images", []int64{1, 784}, make([]int64, 784))}})
	wantCode(t, "dtype", err, codes.InvalidArgument, "images")
	_, err = e.rt.Infer(ctx, &hamsv1.BatchRequest{Model: "fashion", Inputs: []*hamsv1.Tensor{f32("pixels", 1, 784, 0)}})
	wantCode(t, "missing", err, codes.InvalidArgument, "images")
	_, err = e.rt.Infer(ctx, &hamsv1.BatchRequest{Model: "fashion", Inputs: []*hamsv1.Tensor{{Name: "images", Datatype: "FP32", Shape: []int64{1, 784}, Data: []byte{1, 2}}}})
	wantCode(t, "short data", err, codes.InvalidArgument, "images")
	_, err = e.rt.Infer(ctx, &hamsv1.BatchRequest{Model: "ghost"})
	wantCode(t, "unknown", err, codes.NotFound, "ghost")
	_, err = e.rt.Infer(ctx, &hamsv1.BatchRequest{})
	wantCode(t, "no model", err, codes.InvalidArgument, "")
	// compute / update split
	x := f32("x", 2, 4, 0.3)
	c, err := e.rt.Compute(ctx, &hamsv1.BatchRequest{Model: "seq", Inputs: []*hamsv1.Tensor{x}, Rows: []uint32{1, 1}, StreamIds: []string{"a", "b"}, BatchId: 5})
	if err != nil || c.NextStateVersion != 1 || c.BatchId != 5 {
		t.Fatal(c, err)
	}
	_, err = e.rt.Update(ctx, &hamsv1.UpdateRequest{Model: "seq", BatchId: 4})
	wantCode(t, "update unstaged", err, codes.FailedPrecondition, "4")
	u, err := e.rt.Update(ctx, &hamsv1.UpdateRequest{Model: "seq", BatchId: 5})
	if err != nil || u.StateVersion != 1 {
		t.Fatal(u, err)
	}
	_, err = e.rt.Update(ctx, &hamsv1.UpdateRequest{Model: "ghost", BatchId: 5})
	wantCode(t, "update ghost", err, codes.NotFound, "ghost")
	// read state in chunks
	hdr, data, sum := readState(t, e, "seq", 4096)
	if hdr.StateVersion != 1 || hdr.TotalBytes != 5632 || len(hdr.Tensors) != 3 || len(data) != 5632 || sum != shaHex(data) { // h, c, the stream table
		t.Fatalf("read state: %v, %d bytes", hdr, len(data))
	}
	// stateless read: one header chunk, last, empty digest
	shdr, sdata, ssum := readState(t, e, "fashion", 0)
	if shdr.TotalBytes != 0 || len(sdata) != 0 || ssum != shaHex(nil) {
		t.Fatalf("stateless read: %v", shdr)
	}
	// write it back after another step: state returns to version 1 bytes
	if _, err := e.rt.Infer(ctx, &hamsv1.BatchRequest{Model: "seq", Inputs: []*hamsv1.Tensor{x}, BatchId: 6}); err != nil {
		t.Fatal(err)
	}
	w, err := writeState(ctx, e, hdr, data, sum, 1000)
	if err != nil || w.StateVersion != 1 || w.Sha256 != sum {
		t.Fatal(w, err)
	}
	_, data2, _ := readState(t, e, "seq", 0)
	if shaHex(data2) != sum {
		t.Fatal("state after WriteState differs")
	}
	_, err = writeState(ctx, e, hdr, data, "00", 1000)
	wantCode(t, "bad sha", err, codes.InvalidArgument, "sha256")
	_, err = writeState(ctx, e, hdr, data[:100], shaHex(data[:100]), 1000)
	wantCode(t, "short", err, codes.InvalidArgument, "")
	bh := proto.Clone(hdr).(*hamsv1.StateChunk)
	bh.TotalBytes = 8
	_, err = writeState(ctx, e, bh, data[:8], shaHex(data[:8]), 1000)
	wantCode(t, "wrong total", err, codes.InvalidArgument, "seq")
	gh := proto.Clone(hdr).(*hamsv1.StateChunk)
	gh.Model = "ghost"
	_, err = writeState(ctx, e, gh, data, sum, 1000)
	wantCode(t, "write ghost", err, codes.NotFound, "ghost")
	// a gap in offsets, more bytes than declared, no last chunk
	for name, chunks := range map[string][]*hamsv1.StateChunk{
		"gap":     {{Offset: 0, Data: data[:100]}, {Offset: 200, Data: data[200:], Last: true, Sha256: sum}},
		"overrun": {{Offset: 0, Data: data}, {Offset: uint64(len(data)), Data: []byte{1}, Last: true, Sha256: sum}},
		"no last": {{Offset: 0, Data: data}},
	} {
		ws, err := e.rt.WriteState(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ws.Send(&hamsv1.StateChunk{Model: "seq", StateVersion: 2, Tensors: hdr.Tensors, TotalBytes: hdr.TotalBytes})
		for _, c := range chunks {
			ws.Send(c)
		}
		_, err = ws.CloseAndRecv()
		wantCode(t, name, err, codes.InvalidArgument, "seq")
	}
	wt := proto.Clone(hdr).(*hamsv1.StateChunk)
	wt.Tensors[0].Shape = []int64{8, 64}
	_, err = writeState(ctx, e, wt, data, sum, 1000)
	wantCode(t, "wrong tensor spec", err, codes.InvalidArgument, "seq")
	// chunk_bytes below the minimum is raised to 4 KiB: the first data
	// chunk of the 5632-byte state holds 4096 bytes, the rest follows
	st1, err := e.rt.ReadState(ctx, &hamsv1.ReadStateRequest{Model: "seq", ChunkBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	st1.Recv()
	if c, err := st1.Recv(); err != nil || len(c.Data) != 4096 || c.Last {
		t.Fatalf("clamped chunk: %d bytes, last %v, %v", len(c.GetData()), c.GetLast(), err)
	}
	st, _ := e.rt.WriteState(ctx)
	st.CloseSend()
	_, err = st.CloseAndRecv()
	wantCode(t, "empty write", err, codes.InvalidArgument, "")
	_, err = e.rt.StateHandles(ctx, &hamsv1.StateHandlesRequest{Model: "seq"})
	wantCode(t, "handles", err, codes.Unimplemented, "not implemented")
	rs, _ := e.rt.ReadState(ctx, &hamsv1.ReadStateRequest{Model: "ghost"})
	_, err = rs.Recv()
	wantCode(t, "read ghost", err, codes.NotFound, "ghost")
	// metrics: request counts, latency and state gauge are exported
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		found[mf.GetName()] = true
	}
	for _, n := range []string{"hams_refserver_requests_total", "hams_refserver_batch_seconds", "hams_refserver_state_bytes",
		"hams_refserver_stream_slots_live", "hams_refserver_stream_slots", "hams_refserver_stream_evictions_total"} {
		if !found[n] {
			t.Errorf("metric %s missing", n)
		}
	}
}

func shaHex(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func readState(t *testing.T, e *env, model string, chunk uint32) (*hamsv1.StateChunk, []byte, string) {
	t.Helper()
	st, err := e.rt.ReadState(ctxT(t), &hamsv1.ReadStateRequest{Model: model, ChunkBytes: chunk})
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var data []byte
	last := hdr
	for !last.Last {
		if last, err = st.Recv(); err != nil {
			t.Fatal(err)
		}
		if last.Offset != uint64(len(data)) {
			t.Fatalf("chunk offset %d, have %d", last.Offset, len(data))
		}
		data = append(data, last.Data...)
	}
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("after last chunk: %v", err)
	}
	return hdr, data, last.Sha256
}

func writeState(ctx context.Context, e *env, hdr *hamsv1.StateChunk, data []byte, sum string, chunk int) (*hamsv1.WriteStateResponse, error) {
	st, err := e.rt.WriteState(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&hamsv1.StateChunk{Model: hdr.Model, StateVersion: hdr.StateVersion, Tensors: hdr.Tensors, TotalBytes: hdr.TotalBytes}); err != nil {
		return st.CloseAndRecv()
	}
	for off := 0; off < len(data); off += chunk {
		end := min(off+chunk, len(data))
		c := &hamsv1.StateChunk{Offset: uint64(off), Data: data[off:end]}
		if end == len(data) {
			c.Last, c.Sha256 = true, sum
		}
		if err := st.Send(c); err != nil {
			break
		}
	}
	return st.CloseAndRecv()
}

func TestKServe(t *testing.T) {
	e := start(t)
	ctx := ctxT(t)
	if r, err := e.ks.ServerLive(ctx, &inference.ServerLiveRequest{}); err != nil || !r.Live {
		t.Fatal(r, err)
	}
	if r, err := e.ks.ServerReady(ctx, &inference.ServerReadyRequest{}); err != nil || !r.Ready {
		t.Fatal(r, err)
	}
	if r, err := e.ks.ModelReady(ctx, &inference.ModelReadyRequest{Name: "fashion"}); err != nil || !r.Ready {
		t.Fatal(r, err)
	}
	// Unknown model or version: not ready, no error, as Triton answers.
	for _, r := range []*inference.ModelReadyRequest{{Name: "ghost"}, {Name: "fashion", Version: "7"}} {
		if mr, err := e.ks.ModelReady(ctx, r); err != nil || mr.Ready {
			t.Fatalf("ready %v: %v %v", r, mr, err)
		}
	}
	_, err := e.ks.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "fashion", Version: "7"})
	wantCode(t, "metadata version 7", err, codes.NotFound, "7")
	if r, err := e.ks.ServerMetadata(ctx, &inference.ServerMetadataRequest{}); err != nil || r.Name == "" {
		t.Fatal(r, err)
	}
	md, err := e.ks.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "fashion"})
	if err != nil || md.Inputs[0].Name != "images" || md.Outputs[0].Name != "scores" || md.Inputs[0].Shape[1] != 784 {
		t.Fatal(md, err)
	}
	_, err = e.ks.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "ghost"})
	wantCode(t, "metadata ghost", err, codes.NotFound, "ghost")
	img := make([]float32, 784)
	for i := range img {
		img[i] = float32(i%255) / 255
	}
	typed := &inference.ModelInferRequest{ModelName: "fashion", Id: "r1", Inputs: []*inference.ModelInferRequest_InferInputTensor{
		{Name: "images", Datatype: "FP32", Shape: []int64{1, 784}, Contents: &inference.InferTensorContents{Fp32Contents: img}}}}
	r1, err := e.ks.ModelInfer(ctx, typed)
	if err != nil || r1.Id != "r1" || len(r1.RawOutputContents) != 1 || len(r1.RawOutputContents[0]) != 40 || r1.Outputs[0].Name != "scores" {
		t.Fatal(r1, err)
	}
	raw := &inference.ModelInferRequest{ModelName: "fashion", Inputs: []*inference.ModelInferRequest_InferInputTensor{
		{Name: "images", Datatype: "FP32", Shape: []int64{1, 784}}}, RawInputContents: [][]byte{tensor.FromFloat32("images", []int64{1, 784}, img).Data},
		Outputs: []*inference.ModelInferRequest_InferRequestedOutputTensor{{Name: "scores"}}}
	r2, err := e.ks.ModelInfer(ctx, raw)
	if err != nil || !closeRaw(r2.RawOutputContents[0], r1.RawOutputContents[0]) {
		t.Fatal("raw and typed inputs disagree", err)
	}
	// sequence_id selects the LSTM stream: int64 and string forms
	before := slotBytes(t, e, "7")
	seq := func(p *inference.InferParameter) error {
		_, err := e.ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "seq", Parameters: map[string]*inference.InferParameter{"sequence_id": p},
			Inputs: []*inference.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 4}, Contents: &inference.InferTensorContents{Fp32Contents: []float32{1, 2, 3, 4}}}}})
		return err
	}
	if err := seq(&inference.InferParameter{ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: 7}}); err != nil {
		t.Fatal(err)
	}
	after := slotBytes(t, e, "7")
	if after == before {
		t.Fatal("sequence_id 7 did not update slot of stream \"7\"")
	}
	if err := seq(&inference.InferParameter{ParameterChoice: &inference.InferParameter_StringParam{StringParam: "7"}}); err != nil {
		t.Fatal(err)
	}
	if slotBytes(t, e, "7") == after {
		t.Fatal("string sequence_id did not address stream \"7\"")
	}
	wantCode(t, "bool seq", seq(&inference.InferParameter{ParameterChoice: &inference.InferParameter_BoolParam{BoolParam: true}}), codes.InvalidArgument, "sequence_id")
	// int64 typed contents reach prep's labels passthrough
	lr, err := e.ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "norm", Inputs: []*inference.ModelInferRequest_InferInputTensor{
		{Name: "x", Datatype: "FP32", Shape: []int64{2, 3}, Contents: &inference.InferTensorContents{Fp32Contents: []float32{1, 2, 3, 4, 5, 6}}},
		{Name: "labels", Datatype: "INT64", Shape: []int64{2}, Contents: &inference.InferTensorContents{Int64Contents: []int64{4, -1}}}}})
	if err != nil || len(lr.Outputs) != 2 || lr.Outputs[1].Datatype != "INT64" {
		t.Fatal(lr, err)
	}
	// Typed contents beside raw_input_contents are refused, as Triton
	// refuses them; an empty contents message on a raw input is none.
	_, err = e.ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "norm", Inputs: []*inference.ModelInferRequest_InferInputTensor{
		{Name: "labels", Datatype: "INT64", Shape: []int64{2}, Contents: &inference.InferTensorContents{Int64Contents: []int64{4, -1}}},
		{Name: "x", Datatype: "FP32", Shape: []int64{2, 3}}},
		RawInputContents: [][]byte{tensor.FromFloat32("x", []int64{2, 3}, []float32{1, 2, 3, 4, 5, 6}).Data}})
	wantCode(t, "raw and typed inputs", err, codes.InvalidArgument, "contents must not be given")
	img784 := images784()
	emptyContents, err := e.ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "fashion", Inputs: []*inference.ModelInferRequest_InferInputTensor{
		{Name: "images", Datatype: "FP32", Shape: []int64{1, 784}, Contents: &inference.InferTensorContents{}}}, RawInputContents: [][]byte{img784.Data}})
	if err != nil || len(emptyContents.RawOutputContents) != 1 {
		t.Fatal("raw input with an empty contents message:", emptyContents, err)
	}
	// bad inputs
	bad := func(name string, req *inference.ModelInferRequest, code codes.Code, want string) {
		_, err := e.ks.ModelInfer(ctx, req)
		wantCode(t, name, err, code, want)
	}
	in := func(name, dt string, shape []int64, c *inference.InferTensorContents) []*inference.ModelInferRequest_InferInputTensor {
		return []*inference.ModelInferRequest_InferInputTensor{{Name: name, Datatype: dt, Shape: shape, Contents: c}}
	}
	bad("unknown model", &inference.ModelInferRequest{ModelName: "ghost"}, codes.NotFound, "ghost")
	bad("bad version", &inference.ModelInferRequest{ModelName: "fashion", ModelVersion: "9"}, codes.NotFound, "9")
	bad("no inputs", &inference.ModelInferRequest{ModelName: "fashion"}, codes.InvalidArgument, "")
	bad("count", &inference.ModelInferRequest{ModelName: "fashion", Inputs: in("images", "FP32", []int64{1, 784}, &inference.InferTensorContents{Fp32Contents: img[:10]})}, codes.InvalidArgument, "images")
	bad("wrong field", &inference.ModelInferRequest{ModelName: "fashion", Inputs: in("images", "FP32", []int64{1, 784}, &inference.InferTensorContents{Int64Contents: make([]int64, 784)})}, codes.InvalidArgument, "images")
	bad("dtype", &inference.ModelInferRequest{ModelName: "fashion", Inputs: in("images", "INT64", []int64{1, 784}, &inference.InferTensorContents{Int64Contents: make([]int64, 784)})}, codes.InvalidArgument, "images")
	bad("unknown dtype", &inference.ModelInferRequest{ModelName: "fashion", Inputs: in("images", "FP128", []int64{1, 784}, nil)}, codes.InvalidArgument, "images")
	bad("missing input", &inference.ModelInferRequest{ModelName: "fashion", Inputs: in("pixels", "FP32", []int64{1, 784}, &inference.InferTensorContents{Fp32Contents: img})}, codes.InvalidArgument, "images")
	bad("negative dim", &inference.ModelInferRequest{ModelName: "fashion", Inputs: in("images", "FP32", []int64{-1, 784}, nil)}, codes.InvalidArgument, "images")
	bad("raw count", &inference.ModelInferRequest{ModelName: "fashion", Inputs: in("images", "FP32", []int64{1, 784}, nil), RawInputContents: [][]byte{{1}, {2}}}, codes.InvalidArgument, "raw_input_contents")
	bad("raw size", &inference.ModelInferRequest{ModelName: "fashion", Inputs: in("images", "FP32", []int64{1, 784}, nil), RawInputContents: [][]byte{{1, 2, 3}}}, codes.InvalidArgument, "images")
	bad("raw and typed", &inference.ModelInferRequest{ModelName: "fashion", Inputs: in("images", "FP32", []int64{1, 784}, &inference.InferTensorContents{Fp32Contents: img}), RawInputContents: [][]byte{raw.RawInputContents[0]}}, codes.InvalidArgument, "contents must not be given")
	bad("unknown output", &inference.ModelInferRequest{ModelName: "fashion", Inputs: raw.Inputs, RawInputContents: raw.RawInputContents,
		Outputs: []*inference.ModelInferRequest_InferRequestedOutputTensor{{Name: "logits"}}}, codes.InvalidArgument, "logits")
	bad("nil input", &inference.ModelInferRequest{ModelName: "fashion", Inputs: []*inference.ModelInferRequest_InferInputTensor{nil}}, codes.InvalidArgument, "")
	_, err = e.ks.SystemSharedMemoryRegister(ctx, &inference.SystemSharedMemoryRegisterRequest{Name: "r"})
	wantCode(t, "shm", err, codes.InvalidArgument, "no key")
	_, err = e.ks.CudaSharedMemoryRegister(ctx, &inference.CudaSharedMemoryRegisterRequest{Name: "r"})
	wantCode(t, "cuda", err, codes.InvalidArgument, "raw_handle has 0 bytes")
	// still serving
	if _, err := e.ks.ModelInfer(ctx, typed); err != nil {
		t.Fatal(err)
	}
}

// slotBytes digests the h row of stream id's slot in model seq.
func slotBytes(t *testing.T, e *env, id string) string {
	_, ts, err := models.StateTensors(e.srv.Model("seq"))
	if err != nil {
		t.Fatal(err)
	}
	sl := models.Slot(id, 64)
	return string(ts[0].Data[sl*8*4 : (sl+1)*8*4])
}

func tp(dt tfpb.DataType, shape []int64) *tfpb.TensorProto {
	s := &tfpb.TensorShapeProto{}
	for _, d := range shape {
		s.Dim = append(s.Dim, &tfpb.TensorShapeProto_Dim{Size: d})
	}
	return &tfpb.TensorProto{Dtype: dt, TensorShape: s}
}

func TestTFServing(t *testing.T) {
	e := start(t)
	ctx := ctxT(t)
	spec := &tfapis.ModelSpec{Name: "fashion"}
	img := make([]float32, 784)
	for i := range img {
		img[i] = 0.5
	}
	typed := tp(tfpb.DataType_DT_FLOAT, []int64{1, 784})
	typed.FloatVal = img
	r1, err := e.tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: spec, Inputs: map[string]*tfpb.TensorProto{"images": typed}})
	if err != nil {
		t.Fatal(err)
	}
	out := r1.Outputs["scores"]
	// Typed fields, TF Serving's default response encoding.
	if out == nil || out.Dtype != tfpb.DataType_DT_FLOAT || len(out.FloatVal) != 10 || len(out.TensorContent) != 0 || r1.ModelSpec.GetName() != "fashion" || r1.ModelSpec.SignatureName != DefaultSignature {
		t.Fatal(r1)
	}
	// broadcast of a single value and tensor_content give the same answer
	bc := tp(tfpb.DataType_DT_FLOAT, []int64{1, 784})
	bc.FloatVal = []float32{0.5}
	r2, err := e.tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion", SignatureName: DefaultSignature,
		VersionChoice: &tfapis.ModelSpec_Version{Version: wrapperspb.Int64(1)}}, Inputs: map[string]*tfpb.TensorProto{"images": bc}, OutputFilter: []string{"scores"}})
	if err != nil || !closeFloats(r2.Outputs["scores"].GetFloatVal(), out.FloatVal) {
		t.Fatal("broadcast differs", err)
	}
	ct := tp(tfpb.DataType_DT_FLOAT, []int64{1, 784})
	ct.TensorContent = tensor.FromFloat32("images", []int64{1, 784}, img).Data
	r3, err := e.tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: spec, Inputs: map[string]*tfpb.TensorProto{"images": ct}})
	if err != nil || !closeFloats(r3.Outputs["scores"].GetFloatVal(), out.FloatVal) {
		t.Fatal("tensor_content differs", err)
	}
	// int64 typed values (prep labels passthrough)
	x := tp(tfpb.DataType_DT_FLOAT, []int64{2, 3})
	x.FloatVal = []float32{1, 2, 3, 4, 5, 6}
	lb := tp(tfpb.DataType_DT_INT64, []int64{2})
	lb.Int64Val = []int64{1, 2}
	r4, err := e.tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "norm"}, Inputs: map[string]*tfpb.TensorProto{"x": x, "labels": lb}})
	if err != nil || r4.Outputs["labels"].GetDtype() != tfpb.DataType_DT_INT64 {
		t.Fatal(r4, err)
	}
	bad := func(name string, req *tfapis.PredictRequest, code codes.Code, want string) {
		_, err := e.tf.Predict(ctx, req)
		wantCode(t, name, err, code, want)
	}
	in := func(p *tfpb.TensorProto) map[string]*tfpb.TensorProto {
		return map[string]*tfpb.TensorProto{"images": p}
	}
	bad("no spec", &tfapis.PredictRequest{}, codes.InvalidArgument, "model_spec")
	bad("unknown", &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "ghost"}}, codes.NotFound, "ghost")
	bad("version", &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion", VersionChoice: &tfapis.ModelSpec_Version{Version: wrapperspb.Int64(3)}}}, codes.NotFound, "3")
	bad("signature", &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion", SignatureName: "other"}}, codes.FailedPrecondition, "other")
	bad("label", &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion", VersionChoice: &tfapis.ModelSpec_VersionLabel{VersionLabel: "canary"}}}, codes.InvalidArgument, "canary")
	bad("duplicate filter", &tfapis.PredictRequest{ModelSpec: spec, Inputs: in(typed), OutputFilter: []string{"scores", "scores"}}, codes.InvalidArgument, "duplicate")
	// Many one-value broadcasts of a tiny message: refused against the
	// request's budget (8x the 4 MiB message limit: two of 16 MiB fit) as
	// a whole, before the rest are expanded.
	many := map[string]*tfpb.TensorProto{}
	for i := range 8 {
		b := tp(tfpb.DataType_DT_FLOAT, []int64{4 << 20})
		b.FloatVal = []float32{1}
		many[fmt.Sprintf("in%d", i)] = b
	}
	bad("broadcast budget", &tfapis.PredictRequest{ModelSpec: spec, Inputs: many}, codes.ResourceExhausted, "left of the request's limit")
	bad("no inputs", &tfapis.PredictRequest{ModelSpec: spec}, codes.InvalidArgument, "")
	short := tp(tfpb.DataType_DT_FLOAT, []int64{1, 784})
	short.FloatVal = img[:3]
	bad("count", &tfapis.PredictRequest{ModelSpec: spec, Inputs: in(short)}, codes.InvalidArgument, "images")
	sc := tp(tfpb.DataType_DT_FLOAT, []int64{1, 784})
	sc.TensorContent = []byte{1, 2, 3}
	bad("content size", &tfapis.PredictRequest{ModelSpec: spec, Inputs: in(sc)}, codes.InvalidArgument, "images")
	dt := tp(tfpb.DataType_DT_INT64, []int64{1, 784})
	dt.Int64Val = []int64{1}
	bad("dtype", &tfapis.PredictRequest{ModelSpec: spec, Inputs: in(dt)}, codes.InvalidArgument, "images")
	bad("unsupported dtype", &tfapis.PredictRequest{ModelSpec: spec, Inputs: in(tp(tfpb.DataType_DT_COMPLEX64, []int64{1}))}, codes.InvalidArgument, "images")
	bad("no shape", &tfapis.PredictRequest{ModelSpec: spec, Inputs: in(&tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT})}, codes.InvalidArgument, "images")
	bad("nil tensor", &tfapis.PredictRequest{ModelSpec: spec, Inputs: in(nil)}, codes.InvalidArgument, "images")
	bad("neg dim", &tfapis.PredictRequest{ModelSpec: spec, Inputs: in(tp(tfpb.DataType_DT_FLOAT, []int64{-1, 784}))}, codes.InvalidArgument, "images")
	bad("missing", &tfapis.PredictRequest{ModelSpec: spec, Inputs: map[string]*tfpb.TensorProto{"pixels": typed}}, codes.InvalidArgument, "images")
	bad("filter", &tfapis.PredictRequest{ModelSpec: spec, Inputs: in(typed), OutputFilter: []string{"logits"}}, codes.InvalidArgument, "logits")
	// metadata and status
	md, err := e.tf.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{ModelSpec: spec, MetadataField: []string{"signature_def"}})
	if err != nil {
		t.Fatal(err)
	}
	var sigs tfapis.SignatureDefMap
	if err := md.Metadata["signature_def"].UnmarshalTo(&sigs); err != nil {
		t.Fatal(err)
	}
	sd := sigs.SignatureDef[DefaultSignature]
	if sd == nil || sd.Inputs["images"].GetDtype() != tfpb.DataType_DT_FLOAT || len(sd.Outputs["scores"].GetTensorShape().GetDim()) != 2 {
		t.Fatal(&sigs)
	}
	_, err = e.tf.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{ModelSpec: spec})
	wantCode(t, "no metadata field", err, codes.InvalidArgument, "metadata_field")
	_, err = e.tf.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{ModelSpec: spec, MetadataField: []string{"other"}})
	wantCode(t, "metadata field", err, codes.InvalidArgument, "other")
	_, err = e.tf.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{ModelSpec: &tfapis.ModelSpec{Name: "ghost"}, MetadataField: []string{"signature_def"}})
	wantCode(t, "metadata ghost", err, codes.NotFound, "ghost")
	st, err := e.ms.GetModelStatus(ctx, &tfapis.GetModelStatusRequest{ModelSpec: spec})
	if err != nil || st.ModelVersionStatus[0].State != tfapis.ModelVersionStatus_AVAILABLE {
		t.Fatal(st, err)
	}
	_, err = e.ms.GetModelStatus(ctx, &tfapis.GetModelStatusRequest{ModelSpec: &tfapis.ModelSpec{Name: "ghost"}})
	wantCode(t, "status ghost", err, codes.NotFound, "ghost")
	_, err = e.ms.GetModelStatus(ctx, &tfapis.GetModelStatusRequest{})
	wantCode(t, "status no spec", err, codes.InvalidArgument, "model_spec")
}

// closeFloats compares FP32 typed outputs as closeRaw does.
func closeFloats(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(float64(a[i]-b[i])) > 1e-5 {
			return false
		}
	}
	return true
}

// closeRaw compares FP32 outputs up to the low-bit drift of the parallel
// reducer (the models are non-deterministic by design).
func closeRaw(a, b []byte) bool {
	if len(a) != len(b) || len(a)%4 != 0 {
		return false
	}
	for i := 0; i < len(a); i += 4 {
		x := math.Float32frombits(binary.LittleEndian.Uint32(a[i:]))
		y := math.Float32frombits(binary.LittleEndian.Uint32(b[i:]))
		if math.Abs(float64(x-y)) > 1e-5 {
			return false
		}
	}
	return true
}
