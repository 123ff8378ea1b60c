package refserver

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/shm"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	"github.com/hams-go/hams/refserver/models"
)

func shmKey(t *testing.T, name string, size int) (string, *shm.Region) {
	t.Helper()
	k := fmt.Sprintf("/hams_refserver_test_%d_%s", os.Getpid(), name)
	_ = shm.Unlink(k)
	r, err := shm.Create(k, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(); _ = shm.Unlink(k) })
	return k, r
}

func TestSystemSharedMemory(t *testing.T) {
	e := start(t)
	ctx := ctxT(t)
	inKey, inReg := shmKey(t, "in", 8192)
	outKey, outReg := shmKey(t, "out", 4096)
	reg := func(name, key string, off, size uint64) error {
		_, err := e.ks.SystemSharedMemoryRegister(ctx, &inference.SystemSharedMemoryRegisterRequest{Name: name, Key: key, Offset: off, ByteSize: size})
		return err
	}
	if err := reg("in", inKey, 100, 4*784); err != nil {
		t.Fatal(err)
	}
	if err := reg("out", outKey, 0, 4096); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "duplicate", reg("in", inKey, 0, 8), codes.AlreadyExists, "already in manager")
	wantCode(t, "no name", reg("", inKey, 0, 8), codes.InvalidArgument, "no name")
	wantCode(t, "missing key", reg("x", "/hams_no_such_key", 0, 8), codes.NotFound, "hams_no_such_key")
	wantCode(t, "bad key", reg("x", "/a/b", 0, 8), codes.InvalidArgument, "a/b")
	wantCode(t, "too big", reg("x", inKey, 8000, 400), codes.InvalidArgument, "invalid args")
	st, err := e.ks.SystemSharedMemoryStatus(ctx, &inference.SystemSharedMemoryStatusRequest{})
	if err != nil || len(st.Regions) != 2 || st.Regions["in"].Offset != 100 || st.Regions["in"].Key != inKey {
		t.Fatal(st, err)
	}
	_, err = e.ks.SystemSharedMemoryStatus(ctx, &inference.SystemSharedMemoryStatusRequest{Name: "ghost"})
	wantCode(t, "status ghost", err, codes.NotFound, "ghost")

	img := images784()
	copy(inReg.Bytes()[100:], img.Data)
	req := func(inParams, outParams map[string]*inference.InferParameter) *inference.ModelInferRequest {
		return &inference.ModelInferRequest{ModelName: "fashion", Inputs: []*inference.ModelInferRequest_InferInputTensor{
			{Name: "images", Datatype: "FP32", Shape: []int64{1, 784}, Parameters: inParams}},
			Outputs: []*inference.ModelInferRequest_InferRequestedOutputTensor{{Name: "scores", Parameters: outParams}}}
	}
	direct, err := e.ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "fashion", Inputs: []*inference.ModelInferRequest_InferInputTensor{
		{Name: "images", Datatype: "FP32", Shape: []int64{1, 784}}}, RawInputContents: [][]byte{img.Data}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := e.ks.ModelInfer(ctx, req(wire.ShmParams("in", 0, 4*784), wire.ShmParams("out", 16, 40)))
	if err != nil {
		t.Fatal(err)
	}
	// As Triton answers it: no parameters, an empty raw entry.
	if len(resp.RawOutputContents) != 1 || len(resp.RawOutputContents[0]) != 0 || len(resp.Outputs[0].Parameters) != 0 {
		t.Fatalf("shm output response %v", resp)
	}
	if !closeRaw(outReg.Bytes()[16:56], direct.RawOutputContents[0]) {
		t.Fatal("output in shared memory differs from the direct answer")
	}
	bad := func(what string, r *inference.ModelInferRequest, code codes.Code, want string) {
		t.Helper()
		_, err := e.ks.ModelInfer(ctx, r)
		wantCode(t, what, err, code, want)
	}
	bad("unknown region", req(wire.ShmParams("ghost", 0, 4*784), nil), codes.NotFound, "ghost")
	bad("no byte size", req(map[string]*inference.InferParameter{wire.ParamShmRegion: wire.StrParam("in")}, nil), codes.InvalidArgument, wire.ParamShmByteSize)
	bad("bad offset", req(wire.ShmParams("in", 4*784, 4), nil), codes.InvalidArgument, "Invalid offset")
	bad("over the end", req(wire.ShmParams("in", 8, 4*784), nil), codes.InvalidArgument, "Invalid offset + byte size")
	bad("wrong size", req(wire.ShmParams("in", 0, 4*783), nil), codes.InvalidArgument, "images")
	bad("negative", req(wire.ShmParams("in", -1, 4), nil), codes.InvalidArgument, "negative")
	bad("string size", req(map[string]*inference.InferParameter{wire.ParamShmRegion: wire.StrParam("in"), wire.ParamShmByteSize: wire.StrParam("8")}, nil), codes.InvalidArgument, "int64")
	bad("output too small", req(wire.ShmParams("in", 0, 4*784), wire.ShmParams("out", 0, 8)), codes.InvalidArgument, "should be at least 40 bytes")
	bad("output region unknown", req(wire.ShmParams("in", 0, 4*784), wire.ShmParams("nope", 0, 40)), codes.NotFound, "nope")
	both := req(wire.ShmParams("in", 0, 4*784), nil)
	both.RawInputContents = [][]byte{img.Data}
	// Data both in a region and in the request: the raw entry belongs to
	// no input (shared-memory inputs take none).
	bad("shm and raw", both, codes.InvalidArgument, "belongs to no input")

	// unregister one, unknown (a no-op, as in Triton), then all
	for _, n := range []string{"in", "ghost", ""} {
		if _, err := e.ks.SystemSharedMemoryUnregister(ctx, &inference.SystemSharedMemoryUnregisterRequest{Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.srv.SharedMemoryRegions(); len(got) != 0 {
		t.Fatalf("regions left: %v", got)
	}
	bad("after unregister", req(wire.ShmParams("in", 0, 4*784), nil), codes.NotFound, "in")
}

func images784() *hamsv1.Tensor {
	v := make([]float32, 784)
	for i := range v {
		v[i] = float32(i%255) / 255
	}
	return tensor.FromFloat32("images", []int64{1, 784}, v)
}

func TestExplicitStateModel(t *testing.T) {
	mk := func(kind string, params map[string]any) (models.Model, error) {
		return models.New(&config.Model{Name: "m", Kind: kind, Params: params})
	}
	m, err := mk("lstm", map[string]any{"in_dim": 2, "hidden": 3, "streams": 4, "state": "explicit"})
	if err != nil {
		t.Fatal(err)
	}
	d := m.Describe()
	names := func(specs []*hamsv1.TensorSpec) (out []string) {
		for _, s := range specs {
			out = append(out, s.Name)
		}
		return out
	}
	if d.Stateful || fmt.Sprint(names(d.Inputs)) != "[x h_in c_in streams_in]" || fmt.Sprint(names(d.Outputs)) != "[y h_out c_out streams_out]" || !models.PerStream(m) {
		t.Fatalf("describe %v", d)
	}
	if specs, ok := models.Explicit(m); !ok || len(specs) != 3 {
		t.Fatal("not explicit")
	}
	x := tensor.FromFloat32("x", []int64{1, 2}, []float32{1, 2})
	zeros := tensor.FromFloat32("h_in", []int64{4, 3}, make([]float32, 12))
	c := tensor.FromFloat32("c_in", []int64{4, 3}, make([]float32, 12))
	tab := &hamsv1.Tensor{Name: "streams_in", Datatype: "INT32", Shape: []int64{4, 6}, Data: make([]byte, 96)}
	_, err = m.Infer(&models.Batch{Inputs: []*hamsv1.Tensor{x, zeros, tab}})
	if err == nil || !contains(err.Error(), "c_in") {
		t.Fatalf("missing state input: %v", err)
	}
	short := tensor.FromFloat32("c_in", []int64{3, 3}, make([]float32, 9))
	if _, err = m.Infer(&models.Batch{Inputs: []*hamsv1.Tensor{x, zeros, short, tab}}); err == nil || !contains(err.Error(), "c_in") {
		t.Fatalf("wrong state shape: %v", err)
	}
	if _, err = m.Infer(&models.Batch{Inputs: []*hamsv1.Tensor{x, zeros, zeros, tab}}); err == nil || !contains(err.Error(), "twice") {
		t.Fatalf("duplicate state input: %v", err)
	}
	r, err := m.Infer(&models.Batch{Inputs: []*hamsv1.Tensor{x, zeros, c, tab}, Rows: []uint32{1}, StreamIDs: []string{"s"}})
	if err != nil || len(r.Outputs) != 4 || r.Outputs[1].Name != "h_out" || len(r.Outputs[2].Data) != 48 || r.Outputs[3].Name != "streams_out" {
		t.Fatalf("infer %v %v", r, err)
	}
	if _, err := m.WriteState(1, []byte{1}); err == nil {
		t.Fatal("explicit model accepted state bytes")
	}
	if _, err := mk("prep", map[string]any{"state": "explicit"}); err == nil || !contains(err.Error(), "no state") {
		t.Fatalf("explicit stateless kind: %v", err)
	}
	if _, err := mk("lstm", map[string]any{"state": "outside"}); err == nil || !contains(err.Error(), "outside") {
		t.Fatalf("bad state param: %v", err)
	}
	if _, err := mk("lstm", map[string]any{"state": 3}); err == nil {
		t.Fatal("non-string state param accepted")
	}
	init, err := models.InitialState(&config.Model{Name: "m", Kind: "olearn", Params: map[string]any{"in_dim": 4, "state_mb": 1, "state": "explicit"}})
	if err != nil || len(init) != 4 || init[0].Name != "w1" {
		t.Fatalf("initial state %v", err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestStreamIDsInputAndReadiness(t *testing.T) {
	e := start(t)
	ctx := ctxT(t)
	md, err := e.ks.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "seq"})
	if err != nil || md.Inputs[len(md.Inputs)-1].Name != wire.StreamIDsInput {
		t.Fatalf("seq metadata does not declare %s: %v %v", wire.StreamIDsInput, md, err)
	}
	before7, before8 := slotBytes(t, e, "7"), slotBytes(t, e, "8")
	x := tensor.FromFloat32("x", []int64{2, 4}, []float32{1, 2, 3, 4, 5, 6, 7, 8})
	ids := wire.JoinBytes([][]byte{[]byte("7"), []byte("8")})
	r := &inference.ModelInferRequest{ModelName: "seq", Inputs: []*inference.ModelInferRequest_InferInputTensor{
		wire.InferInput(x), {Name: wire.StreamIDsInput, Datatype: "BYTES", Shape: []int64{2}}}, RawInputContents: [][]byte{x.Data, ids}}
	if _, err := e.ks.ModelInfer(ctx, r); err != nil {
		t.Fatal(err)
	}
	if slotBytes(t, e, "7") == before7 || slotBytes(t, e, "8") == before8 {
		t.Fatal("per-row stream ids did not reach both streams")
	}
	r.Parameters = map[string]*inference.InferParameter{wire.ParamSequenceID: wire.StrParam("7")}
	_, err = e.ks.ModelInfer(ctx, r)
	wantCode(t, "both", err, codes.InvalidArgument, wire.ParamSequenceID)
	r.Parameters = nil
	r.Inputs[1].Shape, r.RawInputContents[1] = []int64{1}, wire.JoinBytes([][]byte{[]byte("7")})
	_, err = e.ks.ModelInfer(ctx, r)
	wantCode(t, "count", err, codes.InvalidArgument, "1 stream ids for 2 rows")
	// readiness
	if err := e.srv.SetReady("ghost", false); err == nil {
		t.Fatal("SetReady of an unknown model")
	}
	if err := e.srv.SetReady("fashion", false); err != nil {
		t.Fatal(err)
	}
	rr, err := e.ks.ModelReady(ctx, &inference.ModelReadyRequest{Name: "fashion"})
	if err != nil || rr.Ready {
		t.Fatal("ModelReady true after SetReady(false)")
	}
	_, err = e.ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "fashion", Inputs: []*inference.ModelInferRequest_InferInputTensor{wire.InferInput(images784())}, RawInputContents: [][]byte{images784().Data}})
	wantCode(t, "not ready", err, codes.Unavailable, "not ready")
	h, err := e.rt.Health(ctx, &hamsv1.HealthRequest{Model: "fashion"})
	if err != nil || h.Ready {
		t.Fatal("runtime health ready after SetReady(false)")
	}
	st, err := e.ms.GetModelStatus(ctx, &tfapis.GetModelStatusRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion"}})
	if err != nil || st.ModelVersionStatus[0].State != tfapis.ModelVersionStatus_UNLOADING {
		t.Fatalf("TF Serving status after SetReady(false): %v %v", st, err)
	}
	_ = e.srv.SetReady("fashion", true)
	st, err = e.ms.GetModelStatus(ctx, &tfapis.GetModelStatusRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion"}})
	if err != nil || st.ModelVersionStatus[0].State != tfapis.ModelVersionStatus_AVAILABLE {
		t.Fatalf("TF Serving status after SetReady(true): %v %v", st, err)
	}
	if rr, _ := e.ks.ModelReady(ctx, &inference.ModelReadyRequest{Name: "fashion"}); !rr.Ready {
		t.Fatal("not ready again")
	}
}

// Compute with delta_region writes the delta's data back to back into a
// registered region and answers offsets and sizes; an unknown region or
// one too small for the delta gets the data inline.
func TestDeltaIntoRegion(t *testing.T) {
	e := start(t)
	ctx := ctxT(t)
	big, bigR := shmKey(t, "delta_big", 1<<16)
	small, _ := shmKey(t, "delta_small", 8)
	for name, key := range map[string]string{"big": big, "small": small} {
		if _, err := e.ks.SystemSharedMemoryRegister(ctx, &inference.SystemSharedMemoryRegisterRequest{Name: name, Key: key, ByteSize: map[string]uint64{"big": 1 << 16, "small": 8}[name]}); err != nil {
			t.Fatal(err)
		}
	}
	compute := func(region string) *hamsv1.BatchResponse {
		t.Helper()
		// The same batch id each time: each compute replaces the staged
		// state with the same one.
		resp, err := e.rt.Compute(ctx, &hamsv1.BatchRequest{Model: "seq", Inputs: []*hamsv1.Tensor{f32("x", 2, 4, 0.5)}, Rows: []uint32{1, 1},
			StreamIds: []string{"a", "b"}, BatchId: 1, StageDelta: true, DeltaRegion: region})
		if err != nil || !resp.GetHasStateDelta() || len(resp.GetStateDelta()) == 0 {
			t.Fatalf("compute (region %q): %v %v", region, resp, err)
		}
		return resp
	}
	want := compute("")
	for _, region := range []string{"nope", "small"} {
		if got := compute(region); got.GetStateDeltaRegion() != "" || !proto.Equal(got, want) {
			t.Fatalf("region %q: got %v, want the inline answer", region, got)
		}
	}
	got := compute("big")
	if got.GetStateDeltaRegion() != "big" || len(got.GetStateDeltaSizes()) != len(want.GetStateDelta()) {
		t.Fatalf("region big: %q, %d sizes for %d ranges", got.GetStateDeltaRegion(), len(got.GetStateDeltaSizes()), len(want.GetStateDelta()))
	}
	win := bigR.Bytes()
	off := uint64(0)
	for i, r := range got.GetStateDelta() {
		w := want.GetStateDelta()[i]
		n := got.GetStateDeltaSizes()[i]
		if r.GetOffset() != w.GetOffset() || len(r.GetData()) != 0 || !bytes.Equal(win[off:off+n], w.GetData()) {
			t.Fatalf("range %d: offset %d (want %d), %d bytes inline, region bytes differ", i, r.GetOffset(), w.GetOffset(), len(r.GetData()))
		}
		off += n
	}
}
