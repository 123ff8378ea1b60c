package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hams-go/hams/adapters/refserver/models"
	"github.com/hams-go/hams/internal/cuda"
	"github.com/hams-go/hams/internal/cuda/cudatest"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/loadgen"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
)

// tritonCudaYAML is examples/triton-lstm.yaml with tl-seq's state in CUDA
// memory (backend state_memory: cuda): each tl-seq sidecar allocates its
// A/B buffers on GPU 0 and registers them with its own model server
// (another process) with CudaSharedMemoryRegister.
const tritonCudaYAML = `
name: triton-lstm
hosts: [h1, h2]
models:
  - name: tl-prep
    kind: prep
    backend: {type: triton}
    batch: {size: 1}
    params: {input: x, output: feat, in_dim: 32, mode: zscore}
    placement: {primary: h1, standby: h2}
  - name: tl-seq
    kind: lstm
    stateful: true
    backend: {type: triton, state_memory: cuda, cuda_device: 0}
    batch: {size: 4, max_wait: 1ms}
    params: {input: feat, output: y, in_dim: 32, hidden: 32, streams: 16, seed: 41, state: explicit}
    placement: {primary: h2, backup: h1}
services:
  - name: triton-lstm
    inputs:
      - {name: x, datatype: FP32, shape: [-1, 32]}
    edges:
      - [frontend, tl-prep]
      - [tl-prep, tl-seq]
      - [tl-seq, frontend]
`

// cudaStateDigests reads the state buffers a triton adapter registered as
// CUDA regions at the model server addr and returns the digest of the
// state in buffer A and in buffer B, as shmStateDigests does for system
// shared memory. The test process cannot map the regions (it has no
// handles: CudaSharedMemoryStatus names them but carries no handle), so it
// asks the server: a ModelInfer of the explicit-state lstm with h_in and
// c_in pointing at the buffer and h_out, c_out returned raw, one row of
// zeros for a probe stream whose slot no load stream uses. The lstm copies
// every slot it does not touch from input to output, so the outputs are
// the buffer's bytes except the probe slot, which held zeros (untouched
// since the initial zero state) and is zeroed again here. The buffers are
// only read; nothing is written to them.
func cudaStateDigests(t *testing.T, addr string, states []string, probe string) map[string]string {
	t.Helper()
	cc, err := grpcx.Dial(addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ks := inference.NewGRPCInferenceServiceClient(cc)
	st, err := ks.CudaSharedMemoryStatus(ctx, &inference.CudaSharedMemoryStatusRequest{})
	if err != nil {
		t.Fatalf("CUDA shm status at %s: %v", addr, err)
	}
	regions := map[string]uint64{}
	for n, r := range st.GetRegions() {
		regions[n] = r.GetByteSize()
	}
	return probeStateDigests(t, ks, regions, states, probe)
}

// probeStateDigests is cudaStateDigests given the server's regions (name
// to byte size); it works for regions of either kind.
func probeStateDigests(t *testing.T, ks inference.GRPCInferenceServiceClient, regions map[string]uint64, states []string, probe string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	md, err := ks.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "tl-seq"})
	if err != nil {
		t.Fatal(err)
	}
	var batchIn *inference.ModelMetadataResponse_TensorMetadata
	shapes := map[string][]int64{}
	for _, in := range md.GetInputs() {
		switch base, isState := strings.CutSuffix(in.GetName(), wire.StateInSuffix); {
		case isState:
			shapes[base] = in.GetShape()
		case in.GetName() != wire.StreamIDsInput:
			batchIn = in
		}
	}
	if batchIn == nil || len(shapes) != len(states) {
		t.Fatalf("tl-seq metadata %v", md)
	}
	out := map[string]string{}
	for _, buf := range []string{"A", "B"} {
		req := &inference.ModelInferRequest{ModelName: "tl-seq",
			Inputs: []*inference.ModelInferRequest_InferInputTensor{
				{Name: batchIn.GetName(), Datatype: "FP32", Shape: []int64{1, batchIn.GetShape()[1]}},
				{Name: wire.StreamIDsInput, Datatype: "BYTES", Shape: []int64{1}}},
			RawInputContents: [][]byte{make([]byte, 4*batchIn.GetShape()[1]), wire.JoinBytes([][]byte{[]byte(probe)})}}
		for _, s := range states {
			var name string
			var size uint64
			for n, sz := range regions {
				if strings.HasSuffix(n, "_"+s+"_"+buf) {
					if name != "" {
						t.Fatalf("two regions for state %s buffer %s: %v", s, buf, regions)
					}
					name, size = n, sz
				}
			}
			if name == "" {
				return nil // not set up yet
			}
			req.Inputs = append(req.Inputs, &inference.ModelInferRequest_InferInputTensor{Name: s + wire.StateInSuffix, Datatype: "FP32",
				Shape: shapes[s], Parameters: wire.ShmParams(name, 0, int64(size))})
			req.RawInputContents = append(req.RawInputContents, []byte{})
			req.Outputs = append(req.Outputs, &inference.ModelInferRequest_InferRequestedOutputTensor{Name: s + wire.StateOutSuffix})
		}
		resp, err := ks.ModelInfer(ctx, req)
		if err != nil {
			t.Fatalf("probe of state buffer %s: %v", buf, err)
		}
		h := sha256.New()
		for i, s := range states {
			data := resp.GetRawOutputContents()[i]
			streams, width := shapes[s][0], shapes[s][1]
			row := int(width) * 4
			slot := models.Slot(probe, int(streams))
			if len(data) != int(streams)*row {
				t.Fatalf("probe output %s: %d bytes, want %d", s, len(data), int(streams)*row)
			}
			clear(data[slot*row : (slot+1)*row])
			h.Write(data)
		}
		out[buf] = hex.EncodeToString(h.Sum(nil))
	}
	return out
}

// probeStream picks a stream id whose lstm slot none of the load's streams
// (s0..s{clients-1}) uses.
func probeStream(t *testing.T, clients, slots int) string {
	t.Helper()
	used := map[int]bool{}
	for c := range clients {
		used[models.Slot(fmt.Sprintf("s%d", c), slots)] = true
	}
	for i := range 1000 {
		if p := fmt.Sprintf("probe-%d", i); !used[models.Slot(p, slots)] {
			return p
		}
	}
	t.Fatal("no free slot for the probe stream")
	return ""
}

// TestTritonLSTMCudaState is TestTritonLSTMSharedMemoryState with tl-seq's
// state in CUDA memory: after load and quiescence the backup applied the
// primary's last snapshot, and that snapshot's state_digest is the digest
// of one of the primary's two CUDA buffers and of one of the backup's (the
// bytes on the GPU, read through each instance's model server; the lstm
// is non-deterministic in its low bits, so equal bytes can only come from
// shipped state). No system shared memory is used for the state. Then a
// SIGKILL of the primary sidecar fails over to the backup, whose adapter
// holds the replicated state in its own CUDA buffers; the streams go on
// and the audit stays consistent. Skipped without a GPU.
func TestTritonLSTMCudaState(t *testing.T) {
	if err := cuda.Available(); err != nil {
		t.Skipf("no GPU: %v", err)
	}
	cfgPath := filepath.Join(t.TempDir(), "triton-lstm-cuda.yaml")
	if err := os.WriteFile(cfgPath, []byte(tritonCudaYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	audit := filepath.Join(t.TempDir(), "audit")
	runDir := t.TempDir()
	up := startHams(t, 90*time.Second, "up", "--config", cfgPath, "--run-dir", runDir, "--audit", audit, "--suspicion-timeout", suspicion)
	dep := tritonDeployment(t, cfgPath)
	cc, err := grpcx.Dial(up.str(t, "frontend_grpc"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	fe := hamsv1.NewFrontendClient(cc)

	const clients = 4
	var maxSeq atomic.Uint64
	st := tritonLoad(t, dep, fe, clients, loadgen.RunConfig{Requests: 240, OnResult: func(r loadgen.Result) {
		for _, l := range r.Reply.GetLineage() {
			if l.GetModel() == "tl-seq" {
				for v := maxSeq.Load(); l.GetSeq() > v && !maxSeq.CompareAndSwap(v, l.GetSeq()); v = maxSeq.Load() {
				}
			}
		}
	}})
	if st.Errors != 0 || st.Replies != 240 || maxSeq.Load() != 240 {
		t.Fatalf("load: %+v, max tl-seq seq in the replies %d", st, maxSeq.Load())
	}
	inst := tritonInstances(t, up.str(t, "manager"), "tl-seq")
	pri, bak := inst[hamsv1.Role_ROLE_PRIMARY], inst[hamsv1.Role_ROLE_BACKUP]
	if pri.backend == "" || bak.backend == "" || pri.backend == bak.backend {
		t.Fatalf("tl-seq primary %+v and backup %+v must each have their own model server", pri, bak)
	}
	// The state is in CUDA regions only: no system region, no shm object.
	for _, addr := range []string{pri.backend, bak.backend} {
		c, err := grpcx.Dial(addr, 0)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		sys, err := inference.NewGRPCInferenceServiceClient(c).SystemSharedMemoryStatus(ctx, &inference.SystemSharedMemoryStatusRequest{})
		cancel()
		c.Close()
		if err != nil || len(sys.GetRegions()) != 0 {
			t.Fatalf("system shared memory at %s with state_memory cuda: %v, %v", addr, sys, err)
		}
	}
	if left := shmLeft(); len(left) > 0 {
		t.Fatalf("shm objects with state_memory cuda: %v", left)
	}
	bc, err := grpcx.Dial(bak.sidecar, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	states := []string{"h", "c"}
	probe := probeStream(t, clients, 16)
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ms, err := hamsv1.NewReplicationClient(bc).GetMaxSeq(ctx, &hamsv1.GetMaxSeqRequest{Model: "tl-seq"})
		cancel()
		if err != nil {
			t.Fatalf("GetMaxSeq at the backup sidecar: %v", err)
		}
		seq, digest := lastDurable(t, audit, "tl-seq")
		pd, bd := cudaStateDigests(t, pri.backend, states, probe), cudaStateDigests(t, bak.backend, states, probe)
		inP := pd != nil && (pd["A"] == digest || pd["B"] == digest)
		inB := bd != nil && (bd["A"] == digest || bd["B"] == digest)
		if ms.GetMaxSeq() == maxSeq.Load() && seq == maxSeq.Load() && inP && inB {
			t.Logf("tl-seq: primary's last seq %d = backup's max seq = its last durable seq; state %s… is in the primary's CUDA buffers %v and the backup's %v",
				seq, digest[:16], short(pd), short(bd))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after quiescence: primary's last seq %d, backup max seq %d, backup durable seq %d digest %s; primary buffers %v, backup buffers %v",
				maxSeq.Load(), ms.GetMaxSeq(), seq, digest, pd, bd)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Failover: SIGKILL the primary sidecar (its model server goes with
	// it, and its CUDA allocations with the process); the manager promotes
	// the backup, whose adapter holds the replicated state on the GPU.
	t.Run("failover", func(t *testing.T) {
		pid := childPID(t, runDir, "sidecar_tl-seq")
		var killed atomic.Bool
		var after atomic.Int64
		cfg := loadgen.RunConfig{Duration: 4 * time.Second, OnResult: func(r loadgen.Result) {
			if killed.Load() && r.Err == nil {
				after.Add(1)
			}
		}}
		go func() {
			time.Sleep(time.Second)
			killed.Store(true)
			syscall.Kill(pid, syscall.SIGKILL)
		}()
		st := tritonLoad(t, dep, fe, clients, cfg)
		if st.Errors != 0 || after.Load() == 0 {
			t.Fatalf("load across the failover: %+v, %d replies after the kill", st, after.Load())
		}
		now := tritonInstances(t, up.str(t, "manager"), "tl-seq")
		if now[hamsv1.Role_ROLE_PRIMARY].id != bak.id {
			t.Fatalf("after the kill the primary is %+v, want the old backup %s", now[hamsv1.Role_ROLE_PRIMARY], bak.id)
		}
		// the new primary's installed state is in its CUDA buffers: the
		// last durable state or a later one it computed
		if d := cudaStateDigests(t, bak.backend, states, probe); d == nil {
			t.Fatal("the new primary has no CUDA state buffers")
		}
		checkAudit(t, audit)
		t.Logf("failover: %d replies, %d after the kill; audit consistent", st.Replies, after.Load())
	})
	up.stop(t, 20*time.Second)
}

// TestTritonLSTMCudaStateFakeDriver runs TestTritonLSTMCudaState against
// the fakecuda test double (where there is no GPU and gcc exists): every
// hams process of the deployment inherits HAMS_LIBCUDA.
func TestTritonLSTMCudaStateFakeDriver(t *testing.T) {
	t.Setenv("HAMS_BIN", hamsBin) // the child reuses this binary
	cudatest.RunWithFakeDriver(t, "^TestTritonLSTMCudaState$", "TestTritonLSTMCudaState")
}
