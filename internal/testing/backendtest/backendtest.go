// Package backendtest is a recording model server for tests: it speaks
// TF Serving's PredictionService (Predict, GetModelMetadata) and
// ModelService (GetModelStatus) and KServe v2's ModelInfer, ModelReady and
// ModelMetadata on one gRPC port, records every call (method, request,
// incoming metadata), answers with a fixed output (an echo of the first
// input) and fails calls on demand. The pass-through tests use it to see
// what reaches a backend through the frontend.
package backendtest

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// Call is one recorded call.
type Call struct {
	Method string // "Predict", "ModelInfer", ...
	Req    proto.Message
	Raw    []byte // a request of a method outside the proto subset (SetRaw)
	MD     metadata.MD
}

// Header and trailer metadata every answer carries (the tests check they
// reach the client).
const (
	HeaderKey  = "x-backend-header"
	TrailerKey = "x-backend-trailer"
)

// Server is the recording backend.
type Server struct {
	tfapis.UnimplementedPredictionServiceServer
	tfapis.UnimplementedModelServiceServer
	inference.UnimplementedGRPCInferenceServiceServer

	// Models are the model names it knows (others are NotFound, as TF
	// Serving and Triton answer).
	Models []string

	srv  *grpc.Server
	lis  net.Listener
	done chan struct{}

	mu    sync.Mutex
	calls []Call
	fail  error
	// rawAnswer answers the methods outside the proto subset (SetRaw).
	rawAnswer func(method string, req []byte) []byte
}

// SetRaw makes the server answer methods it has no handler for (TF
// Serving's Classify, Triton's ModelConfig, ModelStreamInfer, ...): every
// request message, as raw bytes, is recorded (Call.Raw, Call.Method the
// full method name) and answered with answer's bytes, one answer per
// request. Without SetRaw such methods are Unimplemented.
func (s *Server) SetRaw(answer func(method string, req []byte) []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rawAnswer = answer
}

// raw is the unknown-method handler (SetRaw).
func (s *Server) raw(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	s.mu.Lock()
	answer, fail := s.rawAnswer, s.fail
	s.mu.Unlock()
	if answer == nil {
		return status.Errorf(codes.Unimplemented, "unknown method %s", method)
	}
	md, _ := metadata.FromIncomingContext(ss.Context())
	_ = ss.SetHeader(metadata.Pairs(HeaderKey, method))
	ss.SetTrailer(metadata.Pairs(TrailerKey, method))
	for {
		m := &emptypb.Empty{}
		if err := ss.RecvMsg(m); err != nil {
			if errors.Is(err, io.EOF) {
				return fail
			}
			return err
		}
		req := m.ProtoReflect().GetUnknown()
		s.mu.Lock()
		s.calls = append(s.calls, Call{Method: method, Raw: append([]byte(nil), req...), MD: md.Copy()})
		s.mu.Unlock()
		if fail != nil {
			return fail
		}
		out := &emptypb.Empty{}
		out.ProtoReflect().SetUnknown(answer(method, req))
		if err := ss.SendMsg(out); err != nil {
			return err
		}
	}
}

// Start serves on a loopback port until Stop.
func Start(models ...string) (*Server, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{Models: models, lis: lis, done: make(chan struct{})}
	s.srv = grpc.NewServer(grpc.UnknownServiceHandler(s.raw))
	tfapis.RegisterPredictionServiceServer(s.srv, s)
	tfapis.RegisterModelServiceServer(s.srv, s)
	inference.RegisterGRPCInferenceServiceServer(s.srv, s)
	go func() { defer close(s.done); _ = s.srv.Serve(lis) }()
	return s, nil
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Stop stops the server (calls then fail Unavailable at the client).
func (s *Server) Stop() {
	s.srv.Stop()
	<-s.done
}

// FailWith makes every following call fail with err (nil: succeed).
func (s *Server) FailWith(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = err
}

// Calls returns the calls recorded so far.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// Last returns the last recorded call of method.
func (s *Server) Last(method string) (Call, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.calls) - 1; i >= 0; i-- {
		if s.calls[i].Method == method {
			return s.calls[i], true
		}
	}
	return Call{}, false
}

// record notes the call and answers its header and trailer; it returns
// the error to fail it with (programmed, or NotFound for an unknown
// model).
func (s *Server) record(ctx context.Context, method, model string, req proto.Message) error {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	s.calls = append(s.calls, Call{Method: method, Req: proto.Clone(req), MD: md.Copy()})
	fail := s.fail
	s.mu.Unlock()
	_ = grpc.SetHeader(ctx, metadata.Pairs(HeaderKey, method))
	_ = grpc.SetTrailer(ctx, metadata.Pairs(TrailerKey, method))
	if fail != nil {
		return fail
	}
	for _, m := range s.Models {
		if m == model {
			return nil
		}
	}
	// TF Serving's and Triton's answer to an unknown model.
	return status.Errorf(codes.NotFound, "Servable not found for request: Latest(%s)", model)
}

func spec(name string) *tfapis.ModelSpec {
	return &tfapis.ModelSpec{Name: name, VersionChoice: &tfapis.ModelSpec_Version{Version: wrapperspb.Int64(1)}, SignatureName: "serving_default"}
}

// Predict answers the first input (by sorted name) as output "y".
func (s *Server) Predict(ctx context.Context, req *tfapis.PredictRequest) (*tfapis.PredictResponse, error) {
	if err := s.record(ctx, "Predict", req.GetModelSpec().GetName(), req); err != nil {
		return nil, err
	}
	out := &tfapis.PredictResponse{ModelSpec: spec(req.GetModelSpec().GetName()), Outputs: map[string]*tfpb.TensorProto{}}
	var first string
	for k := range req.GetInputs() {
		if first == "" || k < first {
			first = k
		}
	}
	if first == "" {
		return nil, status.Error(codes.InvalidArgument, "input size must be non-zero")
	}
	out.Outputs["y"] = req.GetInputs()[first]
	return out, nil
}

// GetModelMetadata answers an empty serving_default signature.
func (s *Server) GetModelMetadata(ctx context.Context, req *tfapis.GetModelMetadataRequest) (*tfapis.GetModelMetadataResponse, error) {
	if err := s.record(ctx, "GetModelMetadata", req.GetModelSpec().GetName(), req); err != nil {
		return nil, err
	}
	sigs, _ := anypb.New(&tfapis.SignatureDefMap{SignatureDef: map[string]*tfapis.SignatureDef{"serving_default": {MethodName: "tensorflow/serving/predict"}}})
	return &tfapis.GetModelMetadataResponse{ModelSpec: spec(req.GetModelSpec().GetName()), Metadata: map[string]*anypb.Any{"signature_def": sigs}}, nil
}

// GetModelStatus answers version 1 AVAILABLE.
func (s *Server) GetModelStatus(ctx context.Context, req *tfapis.GetModelStatusRequest) (*tfapis.GetModelStatusResponse, error) {
	if err := s.record(ctx, "GetModelStatus", req.GetModelSpec().GetName(), req); err != nil {
		return nil, err
	}
	return &tfapis.GetModelStatusResponse{ModelVersionStatus: []*tfapis.ModelVersionStatus{{Version: 1, State: tfapis.ModelVersionStatus_AVAILABLE, Status: &tfapis.StatusProto{}}}}, nil
}

// ModelInfer answers the first input as output "y" (raw contents).
func (s *Server) ModelInfer(ctx context.Context, req *inference.ModelInferRequest) (*inference.ModelInferResponse, error) {
	if err := s.record(ctx, "ModelInfer", req.GetModelName(), req); err != nil {
		return nil, err
	}
	if len(req.GetInputs()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "expected 1 inputs but got 0 inputs for model")
	}
	in := req.GetInputs()[0]
	out := &inference.ModelInferResponse{ModelName: req.GetModelName(), ModelVersion: "1", Id: req.GetId(),
		Outputs: []*inference.ModelInferResponse_InferOutputTensor{{Name: "y", Datatype: in.GetDatatype(), Shape: in.GetShape()}}}
	if len(req.GetRawInputContents()) > 0 {
		out.RawOutputContents = [][]byte{req.GetRawInputContents()[0]}
	}
	return out, nil
}

// ModelReady answers ready for a known model.
func (s *Server) ModelReady(ctx context.Context, req *inference.ModelReadyRequest) (*inference.ModelReadyResponse, error) {
	if err := s.record(ctx, "ModelReady", req.GetName(), req); err != nil {
		return nil, err
	}
	return &inference.ModelReadyResponse{Ready: true}, nil
}

// ModelMetadata answers the model's name and platform.
func (s *Server) ModelMetadata(ctx context.Context, req *inference.ModelMetadataRequest) (*inference.ModelMetadataResponse, error) {
	if err := s.record(ctx, "ModelMetadata", req.GetName(), req); err != nil {
		return nil, err
	}
	return &inference.ModelMetadataResponse{Name: req.GetName(), Versions: []string{"1"}, Platform: "backendtest"}, nil
}
