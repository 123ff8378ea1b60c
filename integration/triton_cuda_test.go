package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/cuda"
	"github.com/hams-go/hams/internal/testing/cudatest"
	"github.com/hams-go/hams/internal/wire"
	"github.com/hams-go/hams/protos/inference"
	"github.com/hams-go/hams/refserver/models"
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
	cc := dialInternal(t, addr, operator)
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
	dtypes := map[string]string{}
	for _, in := range md.GetInputs() {
		switch base, isState := strings.CutSuffix(in.GetName(), wire.StateInSuffix); {
		case isState:
			shapes[base], dtypes[base] = in.GetShape(), in.GetDatatype()
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
			req.Inputs = append(req.Inputs, &inference.ModelInferRequest_InferInputTensor{Name: s + wire.StateInSuffix, Datatype: dtypes[s],
				Shape: shapes[s], Parameters: wire.ShmParams(name, 0, int64(size))})
			req.RawInputContents = append(req.RawInputContents, []byte{})
			req.Outputs = append(req.Outputs, &inference.ModelInferRequest_InferRequestedOutputTensor{Name: s + wire.StateOutSuffix})
		}
		resp, err := ks.ModelInfer(ctx, req)
		if err != nil {
			t.Fatalf("probe of state buffer %s: %v", buf, err)
		}
		h := sha256.New()
		// The probe's slot: the one the stream table gave it (a free
		// one), else its preferred one.
		slot := -1
		for i, s := range states {
			if s == "streams" {
				if sl, ok := models.StreamSlotOf(resp.GetRawOutputContents()[i], probe); ok {
					slot = sl
				}
			}
		}
		for i, s := range states {
			data := resp.GetRawOutputContents()[i]
			streams, width := shapes[s][0], shapes[s][1]
			row := int(width) * 4
			if slot < 0 {
				slot = models.Slot(probe, int(streams))
			}
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
// state in CUDA memory (tritonStateReplication: the backup's applied state
// is in one of the primary's and one of the backup's CUDA buffers, read
// through each instance's model server; a SIGKILL of the primary fails
// over to the backup). No system shared memory is used for the state.
// Skipped without a GPU.
func TestTritonLSTMCudaState(t *testing.T) {
	if err := cuda.Available(); err != nil {
		t.Skipf("no GPU: %v", err)
	}
	cfgPath := filepath.Join(t.TempDir(), "triton-lstm-cuda.yaml")
	if err := os.WriteFile(cfgPath, []byte(tritonCudaYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	states := []string{"h", "c", "streams"} // the lstm's state tensors (models/lstm.go)
	probe := probeStream(t, 4, 16)
	tritonStateReplication(t, cfgPath, stateMemory{
		name:         "CUDA",
		digests:      func(t *testing.T, addr string) map[string]string { return cudaStateDigests(t, addr, states, probe) },
		readsByInfer: true,
		loaded: func(t *testing.T, pri, bak tritonInstance) {
			// The state is in CUDA regions only: no system region, no shm object.
			for _, addr := range []string{pri.backend, bak.backend} {
				c := dialInternal(t, addr, operator)
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
		},
	})
}

// TestTritonLSTMCudaStateFakeDriver runs TestTritonLSTMCudaState against
// the fakecuda test double (where there is no GPU and gcc exists): every
// hams process of the deployment inherits HAMS_LIBCUDA.
func TestTritonLSTMCudaStateFakeDriver(t *testing.T) {
	t.Setenv("HAMS_BIN", hamsBin) // the child reuses this binary
	cudatest.RunWithFakeDriver(t, "^TestTritonLSTMCudaState$", "TestTritonLSTMCudaState")
}
