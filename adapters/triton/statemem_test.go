package triton

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/cuda"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/testing/cudatest"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	"github.com/hams-go/hams/refserver"
	"github.com/hams-go/hams/refserver/models"
)

func TestStateMemoryValidates(t *testing.T) {
	cc := dial(t, "127.0.0.1:1")
	for _, c := range []struct {
		mem  StateMemory
		want string
	}{
		{StateMemory{Kind: "gpu"}, `state memory "gpu" is not one of system, cuda`},
		{StateMemory{Kind: MemorySystem, Device: 1}, "takes no CUDA device"},
		{StateMemory{Kind: MemoryCUDA, Device: -1}, "CUDA device -1 is negative"},
	} {
		_, err := NewStateful(Config{Conn: cc, Model: "m"}, WithStateMemory(c.mem))
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.mem, err, c.want)
		}
	}
	// valid, and no I/O: nothing listens at the address, no device is opened
	for _, m := range []StateMemory{{}, {Kind: MemorySystem}, {Kind: MemoryCUDA, Device: 3}} {
		s, err := NewStateful(Config{Conn: cc, Model: "m"}, WithStateMemory(m))
		if err != nil {
			t.Fatalf("%+v: %v", m, err)
		}
		want := m.Kind
		if want == "" {
			want = MemorySystem
		}
		if s.StateMemory() != want {
			t.Fatalf("%+v: state memory %q", m, s.StateMemory())
		}
	}
}

// TestCUDAStateWithoutDriver: on a machine without a usable CUDA driver,
// Setup of a cuda backend fails with FailedPrecondition naming why, and
// registers nothing (no fallback to system shared memory).
func TestCUDAStateWithoutDriver(t *testing.T) {
	if cuda.Available() == nil {
		t.Skip("a CUDA device is available")
	}
	srv := startServer(t)
	s, err := NewStateful(Config{Conn: dial(t, srv.addr), Model: "seqx", Timeout: 5 * time.Second, Logger: quiet}, WithStateMemory(StateMemory{Kind: MemoryCUDA}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	err = s.Setup(ctxT(t))
	wantCode(t, "setup without a driver", err, codes.FailedPrecondition, "state memory cuda:0: cuda: driver unavailable")
	_, err = s.Compute(ctxT(t), lstmBatch(0))
	wantCode(t, "compute without a driver", err, codes.FailedPrecondition, "driver unavailable")
	if r := srv.srv.SharedMemoryRegions(); len(r) != 0 {
		t.Fatalf("fell back to system shared memory: %v", r)
	}
	if r := srv.srv.CUDASharedMemoryRegions(); len(r) != 0 {
		t.Fatalf("CUDA regions registered: %v", r)
	}
}

// The GPU tests drive a reference model server in a child process (this
// test binary, TestChildServer): CUDA IPC cannot open a handle in the
// process that allocated it, and the adapter allocates.
const (
	envServerChild = "HAMS_TRITON_SERVER_CHILD"
	childYAML      = `
name: cuda
hosts: [h1, h2]
models:
  - name: seqx
    kind: lstm
    stateful: true
    params: {in_dim: 4, hidden: 8, streams: 16, deterministic: 1, state: explicit}
    placement: {primary: h1, backup: h2}
  - name: olx
    kind: olearn
    stateful: true
    params: {in_dim: 8, classes: 3, state_mb: 1, expert_width: 4, deterministic: 1, state: explicit}
    placement: {primary: h1, backup: h2}
  - name: olbig
    kind: olearn
    stateful: true
    params: {in_dim: 8, classes: 3, state_mb: 64, expert_width: 4, deterministic: 1, state: explicit}
    placement: {primary: h1, backup: h2}
services:
  - name: s
    edges: [[frontend, seqx], [seqx, olx], [olx, olbig], [olbig, frontend]]
`
)

// TestChildServer serves childYAML's models until its stdin closes, after
// printing "ADDR host:port" (skipped unless run as a GPU test's child).
func TestChildServer(t *testing.T) {
	if os.Getenv(envServerChild) == "" {
		t.Skip("child of the CUDA state-memory tests only")
	}
	d, err := config.Parse([]byte(childYAML))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := refserver.New(refserver.Config{Deployment: d, Models: []string{"seqx", "olx", "olbig"}, GRPCListener: lis,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
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

// childServer starts TestChildServer and returns its address.
func childServer(t testing.TB) string {
	t.Helper()
	return cudatest.StartChild(t, "TestChildServer", envServerChild+"=1")
}

func needGPU(t testing.TB) {
	t.Helper()
	if err := cuda.Available(); err != nil {
		t.Skipf("no GPU: %v", err)
	}
}

func statefulMem(t testing.TB, addr, model string, init []*hamsv1.Tensor, mem StateMemory) *Stateful {
	t.Helper()
	cc, err := grpcx.Dial(addr, 256<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	s, err := NewStateful(Config{Conn: cc, Model: model, Timeout: 20 * time.Second, InitialState: init, Logger: quiet, KeyPrefix: string(mem.Kind[0])}, WithStateMemory(mem))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestCUDAStateMatchesSystem runs the same batches through two adapters
// on one server in another process, one with its state in CUDA memory,
// one in system shared memory (deterministic models): outputs, versions
// and states agree at every step; a third CUDA adapter given the state
// with WriteState continues bit-identically; Close unregisters the CUDA
// regions.
func TestCUDAStateMatchesSystem(t *testing.T) {
	needGPU(t)
	addr := childServer(t)
	ctx := ctxT(t)
	ks := inference.NewGRPCInferenceServiceClient(dial(t, addr))
	cudaMem := StateMemory{Kind: MemoryCUDA, Device: 0}
	for _, tc := range []struct {
		model string
		batch func(int) *hamsv1.BatchRequest
	}{{"seqx", lstmBatch}, {"olx", olearnBatch}} {
		d, err := config.Parse([]byte(childYAML))
		if err != nil {
			t.Fatal(err)
		}
		var init []*hamsv1.Tensor
		if tc.model == "olx" {
			if init, err = models.InitialState(d.Model(tc.model)); err != nil {
				t.Fatal(err)
			}
		}
		sys := statefulMem(t, addr, tc.model, init, StateMemory{Kind: MemorySystem})
		gpu := statefulMem(t, addr, tc.model, init, cudaMem)
		if err := gpu.Setup(ctx); err != nil {
			t.Fatal(err)
		}
		st, err := ks.CudaSharedMemoryStatus(ctx, &inference.CudaSharedMemoryStatusRequest{})
		if err != nil || len(st.Regions) != len(gpu.Regions()) || len(gpu.Regions()) == 0 {
			t.Fatalf("%s: server's CUDA regions %v (%v), adapter's %v", tc.model, st, err, gpu.Regions())
		}
		for _, r := range gpu.Regions() {
			if st.Regions[r].GetByteSize() == 0 {
				t.Fatalf("%s: region %s not registered: %v", tc.model, r, st)
			}
		}
		s0, _, err := gpu.ReadState(ctx)
		if err != nil {
			t.Fatal(err)
		}
		w0, _, _ := sys.ReadState(ctx)
		if digest(s0) != digest(w0) {
			t.Fatalf("%s: initial states differ", tc.model)
		}
		for i := range 5 {
			req := tc.batch(i)
			gr, err := gpu.Compute(ctx, req)
			if err != nil {
				t.Fatalf("%s compute %d: %v", tc.model, i, err)
			}
			sr, err := sys.Compute(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if digest(gr.Outputs) != digest(sr.Outputs) || gr.NextStateVersion != uint64(i+1) {
				t.Fatalf("%s batch %d: outputs differ", tc.model, i)
			}
			// before Update the installed state is still the old one
			if cur, v, _ := gpu.ReadState(ctx); v != uint64(i) || (i == 0 && digest(cur) != digest(s0)) {
				t.Fatalf("%s batch %d: compute changed the installed state (version %d)", tc.model, i, v)
			}
			if err := gpu.Update(ctx, req.BatchId); err != nil {
				t.Fatal(err)
			}
			if err := sys.Update(ctx, req.BatchId); err != nil {
				t.Fatal(err)
			}
			gs, gv, err := gpu.ReadState(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ss, sv, _ := sys.ReadState(ctx)
			if gv != sv || digest(gs) != digest(ss) || digest(gs) == digest(s0) {
				t.Fatalf("%s batch %d: CUDA state (v%d) differs from system state (v%d), or did not change", tc.model, i, gv, sv)
			}
		}
		// a backup in CUDA memory, written with the primary's state
		backup := statefulMem(t, addr, tc.model, nil, cudaMem)
		ps, pv, _ := gpu.ReadState(ctx)
		if err := backup.WriteState(ctx, ps, pv); err != nil {
			t.Fatal(err)
		}
		for i := 5; i < 8; i++ {
			pr, err := gpu.Infer(ctx, tc.batch(i))
			if err != nil {
				t.Fatal(err)
			}
			br, err := backup.Infer(ctx, tc.batch(i))
			if err != nil {
				t.Fatal(err)
			}
			ps, pv, _ := gpu.ReadState(ctx)
			bs, bv, _ := backup.ReadState(ctx)
			if digest(pr.Outputs) != digest(br.Outputs) || pv != bv || digest(ps) != digest(bs) {
				t.Fatalf("%s batch %d: the CUDA backup diverged from the CUDA primary", tc.model, i)
			}
		}
		for _, a := range []*Stateful{gpu, backup} {
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
		}
		st, err = ks.CudaSharedMemoryStatus(ctx, &inference.CudaSharedMemoryStatusRequest{})
		if err != nil || len(st.Regions) != 0 {
			t.Fatalf("%s: CUDA regions left after Close: %v, %v", tc.model, st, err)
		}
		if _, _, err := gpu.ReadState(ctx); err == nil {
			t.Fatal("ReadState after Close succeeded")
		}
	}
}

// BenchmarkReadState copies a 64 MiB state (olbig) out of system shared
// memory (memcpy) and out of CUDA memory (device to host), as the
// sidecar's snapshot does while the next batch computes.
func BenchmarkReadState(b *testing.B) {
	needGPU(b)
	addr := childServer(b)
	for _, mem := range []StateMemory{{Kind: MemorySystem}, {Kind: MemoryCUDA}} {
		b.Run(fmt.Sprintf("%s/64MiB", mem.Kind), func(b *testing.B) {
			s := statefulMem(b, addr, "olbig", nil, mem)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if err := s.Setup(ctx); err != nil {
				b.Fatal(err)
			}
			d, _ := s.Describe(ctx)
			b.SetBytes(int64(d.GetStateBytes()))
			b.ResetTimer()
			for b.Loop() {
				if _, _, err := s.ReadState(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestCUDAWithFakeDriver runs the GPU tests above against the fakecuda
// test double (where there is no GPU and gcc exists).
func TestCUDAWithFakeDriver(t *testing.T) {
	cudatest.RunWithFakeDriver(t, "^(TestCUDAStateMatchesSystem|TestCUDARegionsRegisteredAgain|TestChildServer)$", "TestCUDAStateMatchesSystem", "TestCUDARegionsRegisteredAgain")
}

// TestCUDARegionsRegisteredAgain: the server drops every CUDA region (as
// a restarted one holds none) between two computes; the next Compute
// registers the regions again (CudaSharedMemoryStatus tells which are
// missing) and the state in device memory continues where it was, as the
// internal-state model computes without the loss.
func TestCUDARegionsRegisteredAgain(t *testing.T) {
	needGPU(t)
	addr := childServer(t)
	ctx := ctxT(t)
	ks := inference.NewGRPCInferenceServiceClient(dial(t, addr))
	l := &lockstep{t: t, a: statefulMem(t, addr, "seqx", nil, StateMemory{Kind: MemoryCUDA}), twin: internalTwin(t, "seqx")}
	for i := range 3 {
		l.step(ctx, i)
	}
	if _, err := ks.CudaSharedMemoryUnregister(ctx, &inference.CudaSharedMemoryUnregisterRequest{}); err != nil {
		t.Fatal(err)
	}
	for i := 3; i < 5; i++ {
		l.step(ctx, i)
	}
	st, err := ks.CudaSharedMemoryStatus(ctx, &inference.CudaSharedMemoryStatusRequest{})
	if err != nil || len(st.Regions) != len(l.a.Regions()) {
		t.Fatalf("server's CUDA regions %v (%v), adapter's %v", st, err, l.a.Regions())
	}
}
