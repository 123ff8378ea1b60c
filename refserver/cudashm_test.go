package refserver

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/cuda"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/testing/cudatest"
	"github.com/hams-go/hams/internal/wire"
	"github.com/hams-go/hams/protos/inference"
)

// TestCudaSharedMemoryArgs: the checks that need no GPU, and on a machine
// without a usable driver the FailedPrecondition naming why.
func TestCudaSharedMemoryArgs(t *testing.T) {
	e := start(t)
	ctx := ctxT(t)
	reg := func(name string, raw []byte, dev int64, size uint64) error {
		_, err := e.ks.CudaSharedMemoryRegister(ctx, &inference.CudaSharedMemoryRegisterRequest{Name: name, RawHandle: raw, DeviceId: dev, ByteSize: size})
		return err
	}
	h := make([]byte, cuda.HandleSize)
	wantCode(t, "no name", reg("", h, 0, 8), codes.InvalidArgument, "no name")
	wantCode(t, "short handle", reg("r", h[:63], 0, 8), codes.InvalidArgument, "raw_handle has 63 bytes")
	wantCode(t, "long handle", reg("r", append(h, 0), 0, 8), codes.InvalidArgument, "raw_handle has 65 bytes")
	wantCode(t, "negative device", reg("r", h, -1, 8), codes.InvalidArgument, "device_id -1")
	wantCode(t, "no size", reg("r", h, 0, 0), codes.InvalidArgument, "byte_size 0")
	// one namespace with the system regions
	key, _ := shmKey(t, "cudans", 64)
	if _, err := e.ks.SystemSharedMemoryRegister(ctx, &inference.SystemSharedMemoryRegisterRequest{Name: "sys", Key: key, ByteSize: 64}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "name of a system region", reg("sys", h, 0, 8), codes.AlreadyExists, "already in manager")
	// a zero handle: no driver here, or the driver refuses it
	err := reg("r", h, 0, 8)
	if cerr := cuda.Available(); cerr != nil {
		wantCode(t, "no driver", err, codes.FailedPrecondition, "driver unavailable")
		t.Logf("without a driver: %v", err)
	} else {
		wantCode(t, "zero handle", err, codes.InvalidArgument, "Unable to open CUDA IPC handle")
	}
	st, err := e.ks.CudaSharedMemoryStatus(ctx, &inference.CudaSharedMemoryStatusRequest{})
	if err != nil || len(st.Regions) != 0 {
		t.Fatalf("status after failed registrations: %v, %v", st, err)
	}
	_, err = e.ks.CudaSharedMemoryStatus(ctx, &inference.CudaSharedMemoryStatusRequest{Name: "r"})
	wantCode(t, "status of an unknown region", err, codes.NotFound, "Unable to find cuda shared memory region: 'r'")
	_, err = e.ks.CudaSharedMemoryStatus(ctx, &inference.CudaSharedMemoryStatusRequest{Name: "sys"})
	wantCode(t, "status of a system region", err, codes.NotFound, "'sys'")
	for _, n := range []string{"ghost", "sys", ""} {
		if _, err := e.ks.CudaSharedMemoryUnregister(ctx, &inference.CudaSharedMemoryUnregisterRequest{Name: n}); err != nil {
			t.Fatalf("unregister %q: %v", n, err)
		}
	}
	if got := e.srv.SharedMemoryRegions(); len(got) != 1 || got[0] != "sys" {
		t.Fatalf("CUDA unregister touched the system regions: %v", got)
	}
}

// The GPU tests run the server in a child process (this test binary,
// TestChildServer): CUDA IPC cannot open a handle in the process that
// allocated it, and the test allocates.
const (
	envServerChild = "HAMS_REFSERVER_CHILD"
	childYAML      = `
name: cuda
hosts: [h1, h2]
models:
  - name: seqx
    kind: lstm
    stateful: true
    params: {in_dim: 4, hidden: 8, streams: 16, deterministic: 1, state: explicit}
    placement: {primary: h1, backup: h2}
services:
  - name: s
    edges: [[frontend, seqx], [seqx, frontend]]
`
)

// TestChildServer serves childYAML's models until its stdin closes, after
// printing "ADDR host:port" (skipped unless run as the GPU tests' child).
func TestChildServer(t *testing.T) {
	if os.Getenv(envServerChild) == "" {
		t.Skip("child of the CUDA shared-memory tests only")
	}
	d, err := config.Parse([]byte(childYAML))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Deployment: d, Models: []string{"seqx"}, GRPCListener: lis, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	os.Stdout.WriteString("ADDR " + lis.Addr().String() + "\n")
	if err := srv.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// childServer starts TestChildServer and returns its KServe client.
func childServer(t *testing.T) inference.GRPCInferenceServiceClient {
	t.Helper()
	addr := cudatest.StartChild(t, "TestChildServer", envServerChild+"=1")
	cc, err := grpcx.Dial(addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return inference.NewGRPCInferenceServiceClient(cc)
}

// stateBytes is FP32 data for a state tensor of n values: small, varied.
func stateBytes(n int, seed float32) []byte {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(math.Sin(float64(seed)+float64(i)*0.37)) * 0.5
	}
	return tensor.FromFloat32("s", []int64{int64(n)}, v).Data
}

// TestCudaSharedMemoryLSTM registers CUDA regions allocated by this
// process with a server in a child process and runs an explicit-state
// LSTM step through them: state in from one region (two tensors at
// offsets), state out into two others, batch input and output raw. The
// same step through system shared memory gives the same bytes
// (deterministic model), and the state did change.
func TestCudaSharedMemoryLSTM(t *testing.T) {
	if err := cuda.Available(); err != nil {
		t.Skipf("no GPU: %v", err)
	}
	dev, err := cuda.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dev.Close() })
	ks := childServer(t)
	ctx := ctxT(t)

	const stateN = 16 * 8 // streams x hidden
	sb := stateN * 4
	h, c := stateBytes(stateN, 1), stateBytes(stateN, 2)
	alloc := func(n int) (*cuda.Buffer, []byte) {
		b, err := dev.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		hd, err := b.IPCHandle()
		if err != nil {
			t.Fatal(err)
		}
		return b, hd[:]
	}
	stIn, stInH := alloc(2 * sb)
	hOut, hOutH := alloc(sb)
	cOut, cOutH := alloc(sb + 100)
	if err := stIn.CopyFromHost(0, append(append([]byte{}, h...), c...)); err != nil {
		t.Fatal(err)
	}
	reg := func(name string, raw []byte, size int) error {
		_, err := ks.CudaSharedMemoryRegister(ctx, &inference.CudaSharedMemoryRegisterRequest{Name: name, RawHandle: raw, DeviceId: 0, ByteSize: uint64(size)})
		return err
	}
	for _, r := range []struct {
		name string
		raw  []byte
		size int
	}{{"st_in", stInH, 2 * sb}, {"h_out", hOutH, sb}, {"c_out", cOutH, sb + 100}} {
		if err := reg(r.name, r.raw, r.size); err != nil {
			t.Fatalf("register %s: %v", r.name, err)
		}
	}
	wantCode(t, "duplicate", reg("h_out", hOutH, sb), codes.AlreadyExists, "already in manager")
	wantCode(t, "beyond the allocation", reg("big", hOutH, sb+(4<<20)), codes.InvalidArgument, "out of range")
	_, err = ks.CudaSharedMemoryRegister(ctx, &inference.CudaSharedMemoryRegisterRequest{Name: "dev", RawHandle: hOutH, DeviceId: 99, ByteSize: uint64(sb)})
	wantCode(t, "unknown device", err, codes.FailedPrecondition, "no such device")
	st, err := ks.CudaSharedMemoryStatus(ctx, &inference.CudaSharedMemoryStatusRequest{Name: "c_out"})
	if err != nil || st.Regions["c_out"].GetByteSize() != uint64(sb+100) || st.Regions["c_out"].GetDeviceId() != 0 {
		t.Fatalf("status: %v, %v", st, err)
	}

	x := tensor.FromFloat32("x", []int64{3, 4}, []float32{0.1, -0.2, 0.3, 0.4, 0.5, -0.6, 0.7, 0.8, -0.9, 1, 0.2, 0.1})
	ids := wire.JoinBytes([][]byte{[]byte("a"), []byte("b"), []byte("a")})
	infer := func(hIn, cIn, hO, cO map[string]*inference.InferParameter) (*inference.ModelInferResponse, error) {
		return ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "seqx",
			Inputs: []*inference.ModelInferRequest_InferInputTensor{
				{Name: "x", Datatype: "FP32", Shape: []int64{3, 4}},
				{Name: wire.StreamIDsInput, Datatype: "BYTES", Shape: []int64{3}},
				{Name: "h_in", Datatype: "FP32", Shape: []int64{16, 8}, Parameters: hIn},
				{Name: "c_in", Datatype: "FP32", Shape: []int64{16, 8}, Parameters: cIn},
				// The stream table (models/lstm.go): empty, inline.
				{Name: "streams_in", Datatype: "INT32", Shape: []int64{16, 6}}},
			RawInputContents: [][]byte{x.Data, ids, make([]byte, 16*6*4)},
			Outputs: []*inference.ModelInferRequest_InferRequestedOutputTensor{
				{Name: "y"}, {Name: "h_out", Parameters: hO}, {Name: "c_out", Parameters: cO}, {Name: "streams_out"}}})
	}
	cudaResp, err := infer(wire.ShmParams("st_in", 0, int64(sb)), wire.ShmParams("st_in", int64(sb), int64(sb)),
		wire.ShmParams("h_out", 0, int64(sb)), wire.ShmParams("c_out", 100, int64(sb)))
	if err != nil {
		t.Fatal(err)
	}
	if cudaResp.Outputs[1].GetName() != "h_out" || len(cudaResp.Outputs[1].Parameters) != 0 || len(cudaResp.RawOutputContents[1]) != 0 {
		t.Fatalf("CUDA output response %v", cudaResp.Outputs)
	}
	gotH, gotC := make([]byte, sb), make([]byte, sb)
	if err := hOut.CopyToHost(0, gotH); err != nil {
		t.Fatal(err)
	}
	if err := cOut.CopyToHost(100, gotC); err != nil {
		t.Fatal(err)
	}

	// the same step through system shared memory
	inKey, inReg := shmKey(t, "cuda_cmp_in", 2*sb)
	outKey, outReg := shmKey(t, "cuda_cmp_out", 2*sb)
	copy(inReg.Bytes(), h)
	copy(inReg.Bytes()[sb:], c)
	for name, key := range map[string]string{"sys_in": inKey, "sys_out": outKey} {
		if _, err := ks.SystemSharedMemoryRegister(ctx, &inference.SystemSharedMemoryRegisterRequest{Name: name, Key: key, ByteSize: uint64(2 * sb)}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = ks.SystemSharedMemoryRegister(ctx, &inference.SystemSharedMemoryRegisterRequest{Name: "h_out", Key: inKey, ByteSize: 8})
	wantCode(t, "system region with a CUDA region's name", err, codes.AlreadyExists, "already in manager")
	sysResp, err := infer(wire.ShmParams("sys_in", 0, int64(sb)), wire.ShmParams("sys_in", int64(sb), int64(sb)),
		wire.ShmParams("sys_out", 0, int64(sb)), wire.ShmParams("sys_out", int64(sb), int64(sb)))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(cudaResp.RawOutputContents[0], sysResp.RawOutputContents[0]) || len(cudaResp.RawOutputContents[0]) != 3*8*4 {
		t.Fatal("y differs between CUDA and system shared memory")
	}
	if !bytes.Equal(gotH, outReg.Bytes()[:sb]) || !bytes.Equal(gotC, outReg.Bytes()[sb:]) {
		t.Fatal("the state written to CUDA memory differs from the one written to system shared memory")
	}
	if bytes.Equal(gotH, h) || bytes.Equal(gotC, c) {
		t.Fatal("the step did not change the state")
	}

	// errors keep the system-shm shapes
	_, err = infer(wire.ShmParams("st_in", 0, int64(sb)), wire.ShmParams("st_in", int64(sb), int64(sb)),
		wire.ShmParams("h_out", 0, int64(sb-4)), wire.ShmParams("c_out", 0, int64(sb)))
	wantCode(t, "output region too small", err, codes.InvalidArgument, "should be at least")
	_, err = infer(wire.ShmParams("st_in", int64(sb)+4, int64(sb)), wire.ShmParams("st_in", 0, int64(sb)),
		wire.ShmParams("h_out", 0, int64(sb)), wire.ShmParams("c_out", 0, int64(sb)))
	wantCode(t, "input window past the region", err, codes.InvalidArgument, "Invalid offset + byte size")

	if _, err := ks.CudaSharedMemoryUnregister(ctx, &inference.CudaSharedMemoryUnregisterRequest{Name: "h_out"}); err != nil {
		t.Fatal(err)
	}
	_, err = infer(wire.ShmParams("st_in", 0, int64(sb)), wire.ShmParams("st_in", int64(sb), int64(sb)),
		wire.ShmParams("h_out", 0, int64(sb)), wire.ShmParams("c_out", 0, int64(sb)))
	wantCode(t, "unregistered region", err, codes.NotFound, "h_out")
	if _, err := ks.CudaSharedMemoryUnregister(ctx, &inference.CudaSharedMemoryUnregisterRequest{}); err != nil {
		t.Fatal(err)
	}
	st, err = ks.CudaSharedMemoryStatus(ctx, &inference.CudaSharedMemoryStatusRequest{})
	if err != nil || len(st.Regions) != 0 {
		t.Fatalf("after unregistering all: %v, %v", st, err)
	}
	sys, err := ks.SystemSharedMemoryStatus(ctx, &inference.SystemSharedMemoryStatusRequest{})
	if err != nil || len(sys.Regions) != 2 {
		t.Fatalf("CUDA unregister-all touched the system regions: %v, %v", sys, err)
	}
}

// TestCudaWithFakeDriver runs the GPU tests above against the fakecuda
// test double (where there is no GPU and gcc exists).
func TestCudaWithFakeDriver(t *testing.T) {
	cudatest.RunWithFakeDriver(t, "^(TestCudaSharedMemoryArgs|TestCudaSharedMemoryLSTM|TestChildServer)$", "TestCudaSharedMemoryArgs", "TestCudaSharedMemoryLSTM")
}
