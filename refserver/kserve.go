package refserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/bigmem"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	"github.com/hams-go/hams/refserver/models"
)

type kserveAPI struct {
	inference.UnimplementedGRPCInferenceServiceServer
	s *Server
}

func (a *kserveAPI) ServerLive(context.Context, *inference.ServerLiveRequest) (*inference.ServerLiveResponse, error) {
	return &inference.ServerLiveResponse{Live: true}, nil
}

func (a *kserveAPI) ServerReady(context.Context, *inference.ServerReadyRequest) (*inference.ServerReadyResponse, error) {
	return &inference.ServerReadyResponse{Ready: true}, nil
}

func (a *kserveAPI) ModelReady(ctx context.Context, req *inference.ModelReadyRequest) (*inference.ModelReadyResponse, error) {
	// As Triton answers: an unknown model or version is not ready (OK).
	h, err := a.s.lookup(req.GetName())
	if err != nil || (req.GetVersion() != "" && req.GetVersion() != "1") {
		return &inference.ModelReadyResponse{Ready: false}, nil
	}
	return &inference.ModelReadyResponse{Ready: h.ready()}, nil
}

func (a *kserveAPI) ServerMetadata(context.Context, *inference.ServerMetadataRequest) (*inference.ServerMetadataResponse, error) {
	return &inference.ServerMetadataResponse{Name: "hams-refserver", Version: "1", Extensions: []string{"sequence"}}, nil
}

func specsMeta(specs []*hamsv1.TensorSpec) []*inference.ModelMetadataResponse_TensorMetadata {
	out := make([]*inference.ModelMetadataResponse_TensorMetadata, len(specs))
	for i, s := range specs {
		out[i] = &inference.ModelMetadataResponse_TensorMetadata{Name: s.Name, Datatype: s.Datatype, Shape: s.Shape}
	}
	return out
}

func (a *kserveAPI) ModelMetadata(ctx context.Context, req *inference.ModelMetadataRequest) (*inference.ModelMetadataResponse, error) {
	h, err := a.s.lookup(req.GetName())
	if err != nil {
		return nil, err
	}
	if v := req.GetVersion(); v != "" && v != "1" {
		return nil, status.Errorf(codes.NotFound, "model %q has no version %q (only 1)", h.name, v)
	}
	d := h.m.Describe()
	ins := specsMeta(d.Inputs)
	if models.PerStream(h.m) {
		ins = append(ins, &inference.ModelMetadataResponse_TensorMetadata{Name: wire.StreamIDsInput, Datatype: "BYTES", Shape: []int64{-1}})
	}
	return &inference.ModelMetadataResponse{Name: h.name, Versions: []string{"1"}, Platform: "hams-go_" + d.Kind,
		Inputs: ins, Outputs: specsMeta(d.Outputs)}, nil
}

// kserveTensor converts one input (typed contents, raw bytes or a
// shared-memory region) to a raw hamsv1.Tensor.
func (a *kserveAPI) kserveTensor(in *inference.ModelInferRequest_InferInputTensor, raw []byte, hasRaw bool) (*hamsv1.Tensor, error) {
	if in.Name == "" {
		return nil, status.Error(codes.InvalidArgument, "input tensor without a name")
	}
	if _, ok := in.Parameters[wire.ParamShmRegion]; ok {
		// Triton looks a region name up among both kinds (one namespace).
		if region, _, _ := wire.StringParam(in.Parameters, wire.ParamShmRegion); a.s.cuda.has(region) {
			return a.s.cuda.input(in, raw)
		}
		return a.s.shm.input(in, raw)
	}
	t, err := wire.FromInferInput(in, raw, hasRaw)
	return t, wireStatus(err)
}

// sequenceID reads the "sequence_id" request parameter (int64, uint64 or
// string).
func sequenceID(params map[string]*inference.InferParameter) (string, error) {
	id, err := wire.SequenceID(params)
	return id, wireStatus(err)
}

func (a *kserveAPI) ModelInfer(ctx context.Context, req *inference.ModelInferRequest) (*inference.ModelInferResponse, error) {
	h, err := a.s.lookupReady(req.GetModelName())
	if err != nil {
		return nil, err
	}
	if v := req.ModelVersion; v != "" && v != "1" {
		return nil, status.Errorf(codes.NotFound, "model %q has no version %q (only 1)", h.name, v)
	}
	if len(req.Inputs) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "model %q: request has no inputs", h.name)
	}
	raws, takes, err := wire.RawInputs(req.Inputs, req.RawInputContents)
	if err != nil {
		return nil, wireStatus(err)
	}
	ins := make([]*hamsv1.Tensor, 0, len(req.Inputs))
	var streamIDs *hamsv1.Tensor
	for i, in := range req.Inputs {
		if in == nil {
			return nil, status.Errorf(codes.InvalidArgument, "input %d is empty", i)
		}
		t, err := a.kserveTensor(in, raws[i], takes[i])
		if err != nil {
			return nil, err
		}
		if t.Name == wire.StreamIDsInput {
			streamIDs = t
			continue
		}
		ins = append(ins, t)
	}
	seq, err := sequenceID(req.Parameters)
	if err != nil {
		return nil, err
	}
	streams := []string{seq}
	if streamIDs != nil {
		if seq != "" {
			return nil, status.Errorf(codes.InvalidArgument, "model %q: both parameter %s and input %q", h.name, wire.ParamSequenceID, wire.StreamIDsInput)
		}
		if streamIDs.Datatype != "BYTES" || len(streamIDs.Shape) != 1 {
			return nil, status.Errorf(codes.InvalidArgument, "tensor %q: want BYTES [rows], got %s %v", wire.StreamIDsInput, streamIDs.Datatype, streamIDs.Shape)
		}
		streams = nil
		for _, id := range wire.BytesElems(streamIDs.Data) {
			streams = append(streams, string(id))
		}
		if len(ins) > 0 && len(ins[0].Shape) > 0 && int64(len(streams)) != ins[0].Shape[0] {
			return nil, status.Errorf(codes.InvalidArgument, "model %q: %d stream ids for %d rows in input %q", h.name, len(streams), ins[0].Shape[0], wire.StreamIDsInput)
		}
	}
	// Shared-memory outputs are resolved before the model runs, so a bad
	// region fails the request before a stateful model changes its state.
	shmOut := map[string]*outWindow{}
	defer func() {
		for _, w := range shmOut {
			w.release()
		}
	}()
	for _, o := range req.Outputs {
		if _, cls := o.GetParameters()[wire.ParamClassification]; cls {
			return nil, status.Errorf(codes.InvalidArgument, "model %q: output %q: the classification extension is not supported by the reference server", h.name, o.GetName())
		}
		if _, ok := o.GetParameters()[wire.ParamShmRegion]; !ok {
			continue
		}
		if _, dup := shmOut[o.GetName()]; dup {
			return nil, status.Errorf(codes.InvalidArgument, "output %q requested twice", o.GetName())
		}
		w, err := a.acquireOut(o)
		if err != nil {
			return nil, err
		}
		shmOut[o.GetName()] = w
	}
	outs, err := a.s.infer(ctx, h, "ModelInfer", ins, streams)
	if err != nil {
		return nil, err
	}
	if states, ok := models.Explicit(h.m); ok && a.s.log.Enabled(ctx, slog.LevelDebug) {
		// The state each call started from and produced, as the audit's
		// state_digest of adapters/triton has it (the model's state
		// order): what the adapter's regions held, seen from here.
		a.s.log.Debug("explicit state call", "model", h.name, "api", "ModelInfer", "rows", rowsOf(ins), "streams", len(streams),
			"state_in", explicitStateDigest(states, ins, models.StateIn), "state_out", explicitStateDigest(states, outs, models.StateOut))
	}
	outs, err = filterOutputs(outs, requestedNames(req.Outputs))
	if err != nil {
		return nil, err
	}
	for _, o := range outs {
		if w := shmOut[o.Name]; w != nil && len(o.Data) > w.size {
			return nil, status.Errorf(codes.InvalidArgument, "shared memory size specified with the request for output '%s' (%d bytes) should be at least %d bytes to hold the results", o.Name, w.size, len(o.Data))
		}
	}
	resp := &inference.ModelInferResponse{ModelName: h.name, ModelVersion: "1", Id: req.Id}
	for _, o := range outs {
		ot := wire.InferOutput(o)
		data := o.Data
		if w := shmOut[o.Name]; w != nil {
			if err := w.write(o.Data); err != nil {
				return nil, status.Errorf(codes.Internal, "output '%s': copy to shared memory region '%s': %v", o.Name, w.region, err)
			}
			// As Triton answers an output it wrote to shared memory: name,
			// datatype and shape, no parameters, and an empty entry that
			// keeps raw_output_contents positional. The client knows which
			// outputs it placed in shared memory.
			data = []byte{}
		}
		resp.Outputs = append(resp.Outputs, ot)
		resp.RawOutputContents = append(resp.RawOutputContents, data)
	}
	return resp, nil
}

// outWindow is an output's window of a registered region (system or
// CUDA), pinned from before the model runs until the response is built.
type outWindow struct {
	region  string
	size    int
	write   func([]byte) error
	release func()
}

// acquireOut resolves an output's shared-memory parameters: a CUDA region
// if one of that name is registered, else a system region.
func (a *kserveAPI) acquireOut(o *inference.ModelInferRequest_InferRequestedOutputTensor) (*outWindow, error) {
	if region, _, _ := wire.StringParam(o.GetParameters(), wire.ParamShmRegion); a.s.cuda.has(region) {
		u, err := a.s.cuda.acquire(o.GetName(), o.GetParameters())
		if err != nil {
			return nil, err
		}
		return &outWindow{region: u.r.name, size: u.size, write: u.write, release: func() { a.s.cuda.release(u) }}, nil
	}
	u, err := a.s.shm.acquire(o.GetName(), o.GetParameters())
	if err != nil {
		return nil, err
	}
	return &outWindow{region: u.r.name, size: len(u.buf),
		write:   func(b []byte) error { bigmem.Copy(u.buf, b); return nil },
		release: func() { a.s.shm.release(u) }}, nil
}

func requestedNames(outs []*inference.ModelInferRequest_InferRequestedOutputTensor) []string {
	var names []string
	for _, o := range outs {
		names = append(names, o.GetName())
	}
	return names
}

// filterOutputs keeps the named outputs in request order (all when none
// are named).
func filterOutputs(outs []*hamsv1.Tensor, names []string) ([]*hamsv1.Tensor, error) {
	if len(names) == 0 {
		return outs, nil
	}
	var kept []*hamsv1.Tensor
	for i, n := range names {
		if slices.Contains(names[:i], n) {
			return nil, status.Errorf(codes.InvalidArgument, "duplicate output tensor alias %q", n)
		}
		var found *hamsv1.Tensor
		for _, o := range outs {
			if o.Name == n {
				found = o
			}
		}
		if found == nil {
			return nil, status.Errorf(codes.InvalidArgument, "requested output %q is not an output of the model", n)
		}
		kept = append(kept, found)
	}
	return kept, nil
}

func (a *kserveAPI) SystemSharedMemoryStatus(_ context.Context, req *inference.SystemSharedMemoryStatusRequest) (*inference.SystemSharedMemoryStatusResponse, error) {
	return a.s.shm.status(req.GetName())
}

func (a *kserveAPI) SystemSharedMemoryRegister(_ context.Context, req *inference.SystemSharedMemoryRegisterRequest) (*inference.SystemSharedMemoryRegisterResponse, error) {
	// One namespace for both kinds: hold the CUDA manager's name lock
	// across the check and the insert.
	a.s.cuda.nameMu.Lock()
	err := status.Errorf(codes.AlreadyExists, "shared memory region '%s' already in manager", req.GetName())
	if req.GetName() == "" || !a.s.cuda.has(req.GetName()) {
		err = a.s.shm.register(req.GetName(), req.GetKey(), req.GetOffset(), req.GetByteSize())
	}
	a.s.cuda.nameMu.Unlock()
	if err != nil {
		return nil, err
	}
	a.s.log.Info("system shared memory registered", "region", req.GetName(), "key", req.GetKey(), "offset", req.GetOffset(), "bytes", req.GetByteSize())
	return &inference.SystemSharedMemoryRegisterResponse{}, nil
}

func (a *kserveAPI) SystemSharedMemoryUnregister(_ context.Context, req *inference.SystemSharedMemoryUnregisterRequest) (*inference.SystemSharedMemoryUnregisterResponse, error) {
	a.s.shm.unregister(req.GetName())
	a.s.log.Info("system shared memory unregistered", "region", req.GetName())
	return &inference.SystemSharedMemoryUnregisterResponse{}, nil
}

func (a *kserveAPI) CudaSharedMemoryStatus(_ context.Context, req *inference.CudaSharedMemoryStatusRequest) (*inference.CudaSharedMemoryStatusResponse, error) {
	return a.s.cuda.status(req.GetName())
}

// CudaSharedMemoryRegister opens the client's raw cudaIpcMemHandle_t on
// device_id. Without a usable driver (no GPU, libcuda missing, a nocuda
// build) it is FailedPrecondition naming the cause.
func (a *kserveAPI) CudaSharedMemoryRegister(_ context.Context, req *inference.CudaSharedMemoryRegisterRequest) (*inference.CudaSharedMemoryRegisterResponse, error) {
	err := a.s.cuda.register(req.GetName(), req.GetRawHandle(), req.GetDeviceId(), req.GetByteSize(), func(name string) bool {
		_, err := a.s.shm.status(name)
		return err == nil
	})
	if err != nil {
		return nil, err
	}
	a.s.log.Info("CUDA shared memory registered", "region", req.GetName(), "device", req.GetDeviceId(), "bytes", req.GetByteSize())
	return &inference.CudaSharedMemoryRegisterResponse{}, nil
}

// CudaSharedMemoryUnregister drops a CUDA region ("" drops all of them);
// unknown names succeed, as in Triton.
func (a *kserveAPI) CudaSharedMemoryUnregister(_ context.Context, req *inference.CudaSharedMemoryUnregisterRequest) (*inference.CudaSharedMemoryUnregisterResponse, error) {
	a.s.cuda.unregister(req.GetName())
	a.s.log.Info("CUDA shared memory unregistered", "region", req.GetName())
	return &inference.CudaSharedMemoryUnregisterResponse{}, nil
}

// explicitStateDigest is the hex SHA-256 of the state tensors among ts
// (named state name + suffix) in the model's state order; "" when one is
// missing.
func explicitStateDigest(states []*hamsv1.TensorSpec, ts []*hamsv1.Tensor, suffix string) string {
	h := sha256.New()
	for _, s := range states {
		var found *hamsv1.Tensor
		for _, t := range ts {
			if t.GetName() == s.GetName()+suffix {
				found = t
				break
			}
		}
		if found == nil {
			return ""
		}
		h.Write(found.GetData())
	}
	return hex.EncodeToString(h.Sum(nil))
}
