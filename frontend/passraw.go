package frontend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/hams-go/hams/internal/hamsmd"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Pass-through of the model-scoped methods outside the frontend's proto
// subset (the gRPC server's unknown-method handler): TF Serving's
// Classify, Regress and MultiInference, and KServe v2 / Triton's
// ModelConfig, ModelStatistics and ModelStreamInfer, for a pass-through
// model (ha: off) only. The messages travel as raw bytes (a message
// decoded into emptypb.Empty keeps every field as unknown bytes and
// encodes them back unchanged); the only edits, made on the wire form at
// the upstream field numbers below, are those of the typed pass-through
// (passthrough.go): the model name is the backend's on the way in and the
// client's on the way out, and an empty version gets backend.version
// (backend.signature is Predict's: a Classify or Regress without one gets
// the model's default, as from TF Serving directly). Metadata, deadline and HAMS's
// identity are forward's. Server-wide methods (repository, shared memory,
// trace and log settings, TF Serving's HandleReloadConfigRequest) and any
// method for a model on the HAMS path stay Unimplemented: they are not a
// model's, or the model has no single server to forward to.

// rawRoute says where a method's messages name the model.
type rawRoute struct {
	tf bool // TF Serving's API (else KServe v2)
	// reqPath leads to the message holding the name in a request
	// (ModelSpec for TF Serving, the request itself for KServe);
	// respPath to the one in an answer. Repeated fields on a path are all
	// edited.
	reqPath, respPath []protowire.Number
	// stream: ModelStreamInfer (several requests, each naming the model).
	stream bool
}

// Field numbers: TF Serving ModelSpec{name 1, version 2 (Int64Value{value
// 1}), signature_name 3, version_label 4}; ClassificationRequest /
// RegressionRequest{model_spec 1}, their responses {model_spec 2};
// MultiInferenceRequest{tasks 1: InferenceTask{model_spec 1}},
// MultiInferenceResponse{results 1: InferenceResult{model_spec 1}}. KServe
// ModelConfigRequest / ModelStatisticsRequest{name 1, version 2},
// ModelConfigResponse{config 1: ModelConfig{name 1}},
// ModelStatisticsResponse{model_stats 1: ModelStatistics{name 1}},
// ModelInferRequest{model_name 1, model_version 2},
// ModelStreamInferResponse{infer_response 2: ModelInferResponse{model_name 1}}.
var rawRoutes = map[string]rawRoute{
	"/tensorflow.serving.PredictionService/Classify":       {tf: true, reqPath: []protowire.Number{1}, respPath: []protowire.Number{2}},
	"/tensorflow.serving.PredictionService/Regress":        {tf: true, reqPath: []protowire.Number{1}, respPath: []protowire.Number{2}},
	"/tensorflow.serving.PredictionService/MultiInference": {tf: true, reqPath: []protowire.Number{1, 1}, respPath: []protowire.Number{1, 1}},
	"/inference.GRPCInferenceService/ModelConfig":          {respPath: []protowire.Number{1}},
	"/inference.GRPCInferenceService/ModelStatistics":      {respPath: []protowire.Number{1}},
	"/inference.GRPCInferenceService/ModelStreamInfer":     {respPath: []protowire.Number{2}, stream: true},
}

const (
	nameField    protowire.Number = 1
	ksVersion    protowire.Number = 2
	tfVersion    protowire.Number = 2
	tfLabel      protowire.Number = 4
	int64ValueNr protowire.Number = 1
)

// errRawMessage is a request the frontend cannot read at the upstream
// field numbers.
var errRawMessage = errors.New("frontend: malformed message")

// rawField is one field of a message on the wire: its number and type,
// its whole encoding (tag and value) and, for a length-delimited field,
// its payload.
type rawField struct {
	num     protowire.Number
	typ     protowire.Type
	whole   []byte
	payload []byte
}

// rawFields splits one message level into its fields, in order.
func rawFields(m []byte) ([]rawField, error) {
	var out []rawField
	for len(m) > 0 {
		num, typ, n := protowire.ConsumeTag(m)
		if n < 0 {
			return nil, fmt.Errorf("%w: %v", errRawMessage, protowire.ParseError(n))
		}
		l := protowire.ConsumeFieldValue(num, typ, m[n:])
		if l < 0 {
			return nil, fmt.Errorf("%w: field %d: %v", errRawMessage, num, protowire.ParseError(l))
		}
		f := rawField{num: num, typ: typ, whole: m[:n+l]}
		if typ == protowire.BytesType {
			f.payload, _ = protowire.ConsumeBytes(m[n:])
		}
		out = append(out, f)
		m = m[n+l:]
	}
	return out, nil
}

// mapAt applies f to every message at path inside b (b itself for an
// empty path) and re-encodes b; fields elsewhere are copied unchanged.
func mapAt(b []byte, path []protowire.Number, f func([]byte) ([]byte, error)) ([]byte, error) {
	if len(path) == 0 {
		// The message f edits must be well-formed itself: gRPC's decoder
		// checked only the outer message's fields, not the bytes of one
		// nested in them.
		if _, err := rawFields(b); err != nil {
			return nil, err
		}
		return f(b)
	}
	fields, err := rawFields(b)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(b))
	for _, fl := range fields {
		if fl.num != path[0] || fl.typ != protowire.BytesType {
			out = append(out, fl.whole...)
			continue
		}
		edited, err := mapAt(fl.payload, path[1:], f)
		if err != nil {
			return nil, err
		}
		out = protowire.AppendTag(out, fl.num, protowire.BytesType)
		out = protowire.AppendBytes(out, edited)
	}
	return out, nil
}

// getString reads the last occurrence of string field num of message m
// (none in a malformed message).
func getString(m []byte, num protowire.Number) (string, bool) {
	fields, _ := rawFields(m)
	for i := len(fields) - 1; i >= 0; i-- {
		if fields[i].num == num && fields[i].typ == protowire.BytesType {
			return string(fields[i].payload), true
		}
	}
	return "", false
}

// without drops every occurrence of field num from message m (a
// malformed message is returned as it is).
func without(m []byte, num protowire.Number) []byte {
	fields, err := rawFields(m)
	if err != nil {
		return m
	}
	out := make([]byte, 0, len(m))
	for _, fl := range fields {
		if fl.num != num {
			out = append(out, fl.whole...)
		}
	}
	return out
}

// has says whether message m holds field num.
func has(m []byte, num protowire.Number) bool {
	fields, _ := rawFields(m)
	for _, fl := range fields {
		if fl.num == num {
			return true
		}
	}
	return false
}

func withString(m []byte, num protowire.Number, s string) []byte {
	m = without(m, num)
	m = protowire.AppendTag(m, num, protowire.BytesType)
	return protowire.AppendString(m, s)
}

// requestNames lists the model names a request gives (each occurrence).
func (r rawRoute) requestNames(b []byte) ([]string, error) {
	var names []string
	_, err := mapAt(b, r.reqPath, func(m []byte) ([]byte, error) {
		name, _ := getString(m, nameField)
		names = append(names, name)
		return m, nil
	})
	return names, err
}

// toBackend rewrites a request for p's backend: its model name, and the
// deployment's version where the client gave none.
func (r rawRoute) toBackend(b []byte, p *passThrough) ([]byte, error) {
	return mapAt(b, r.reqPath, func(m []byte) ([]byte, error) {
		m = withString(m, nameField, p.backend.Model)
		v := p.backend.Version
		switch {
		case r.tf:
			if v != "" && !has(m, tfVersion) && !has(m, tfLabel) {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					w := protowire.AppendTag(nil, int64ValueNr, protowire.VarintType)
					w = protowire.AppendVarint(w, uint64(n))
					m = protowire.AppendTag(m, tfVersion, protowire.BytesType)
					m = protowire.AppendBytes(m, w)
				} else {
					m = withString(m, tfLabel, v)
				}
			}
		case v != "":
			if s, _ := getString(m, ksVersion); s == "" {
				m = withString(m, ksVersion, v)
			}
		}
		return m, nil
	})
}

// toClient puts the client's model name back into an answer.
func (r rawRoute) toClient(b []byte, p *passThrough, client string) ([]byte, error) {
	if client == p.backend.Model {
		return b, nil
	}
	return mapAt(b, r.respPath, func(m []byte) ([]byte, error) {
		if name, ok := getString(m, nameField); ok && name == p.backend.Model {
			m = withString(m, nameField, client)
		}
		return m, nil
	})
}

// rawMessage is a message as the wire carries it.
func rawMessage(b []byte) *emptypb.Empty {
	e := &emptypb.Empty{}
	e.ProtoReflect().SetUnknown(b)
	return e
}

// proxyUnknown is the gRPC server's handler of methods it has no handler
// for: the routes above for a pass-through model, Unimplemented else.
func (f *Frontend) proxyUnknown(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	r, ok := rawRoutes[method]
	if !ok || internalMethod(method) {
		return status.Errorf(codes.Unimplemented, "method %s is not served by the HAMS frontend", method)
	}
	first := &emptypb.Empty{}
	if err := ss.RecvMsg(first); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // a stream closed before its first request
		}
		return err
	}
	names, err := r.requestNames(first.ProtoReflect().GetUnknown())
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "%s: %v", method, err)
	}
	client, err := oneName(method, names)
	if err != nil {
		return err
	}
	if err := f.authorizeCtx(ss.Context(), client); err != nil {
		return err
	}
	p := f.passFor(client)
	if p == nil {
		if _, err := f.modelService(client); err != nil {
			return err
		}
		return status.Errorf(codes.Unimplemented, "%s: model %q is served with HA on the HAMS path, where only %s are served; call its model server directly for this method",
			method, client, map[bool]string{true: "Predict, GetModelMetadata and GetModelStatus", false: "ModelInfer, ModelReady and ModelMetadata"}[r.tf])
	}
	if r.tf {
		err = p.needTF()
	} else {
		err = p.needKS()
	}
	if err != nil {
		return err
	}
	// A stream (ModelStreamInfer) lives as long as the client keeps it:
	// no default deadline.
	return f.forwardWith(ss.Context(), p, !r.stream, func(ctx context.Context, opts ...grpc.CallOption) error {
		return f.pumpRaw(ctx, ss, p, r, method, client, first, opts)
	})
}

// oneName is the one model a request names (a MultiInference's tasks must
// all name the same model, as in TF Serving).
func oneName(method string, names []string) (string, error) {
	if len(names) == 0 || names[0] == "" {
		return "", status.Errorf(codes.InvalidArgument, "%s: no model named in the request", method)
	}
	for _, n := range names[1:] {
		if n != names[0] {
			return "", status.Errorf(codes.InvalidArgument, "%s: the request names models %q and %q; one call, one model", method, names[0], n)
		}
	}
	return names[0], nil
}

// pumpRaw runs the call on the backend as a stream (which carries a unary
// call as well): the first request, then the client's further ones (a
// stream's must name the same model), and the backend's answers back,
// until the backend ends the call; its status is the call's. The
// goroutine that forwards the client's requests ends when the call does:
// the client half-closes, or the server ends the stream when this handler
// returns; it counts as a client call (enter/leave), so a frontend's
// shutdown waits for it.
func (f *Frontend) pumpRaw(ctx context.Context, ss grpc.ServerStream, p *passThrough, r rawRoute, method, client string, first *emptypb.Empty, opts []grpc.CallOption) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Counted before anything reaches the backend: a shutdown starting
	// now refuses the call before, not after, its first request went out.
	if !f.enter() {
		return status.Error(codes.Unavailable, ErrShutdown.Error())
	}
	pumping := false
	defer func() {
		if !pumping {
			f.leave()
		}
	}()
	cs, err := p.cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method, opts...)
	if err != nil {
		return err
	}
	send := func(m *emptypb.Empty) error {
		b, err := r.toBackend(m.ProtoReflect().GetUnknown(), p)
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "%s: %v", method, err)
		}
		return cs.SendMsg(rawMessage(b))
	}
	if err := send(first); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	// refused is a later request the frontend would not forward: the call
	// ends with it instead of the backend's status.
	var refused atomic.Pointer[error]
	pumping = true
	go func() {
		defer f.leave()
		for {
			m := &emptypb.Empty{}
			if err := ss.RecvMsg(m); err != nil {
				if errors.Is(err, io.EOF) {
					_ = cs.CloseSend()
				} else {
					cancel()
				}
				return
			}
			names, err := r.requestNames(m.ProtoReflect().GetUnknown())
			switch {
			case err != nil:
				err = status.Errorf(codes.InvalidArgument, "%s: %v", method, err)
			case !r.stream:
				err = status.Errorf(codes.InvalidArgument, "%s: one request per call", method)
			case len(names) != 1 || names[0] != client:
				err = status.Errorf(codes.InvalidArgument, "%s: a request of the stream names model %q; the stream's model is %q", method, strings.Join(names, ", "), client)
			}
			if err == nil {
				if err = send(m); errors.Is(err, io.EOF) {
					return // the backend ended the call: its status is the call's
				}
			}
			if err != nil {
				refused.Store(&err)
				cancel()
				return
			}
		}
	}()
	headerSent := false
	for {
		m := &emptypb.Empty{}
		if err := cs.RecvMsg(m); err != nil {
			if e := refused.Load(); e != nil {
				return *e
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if !headerSent {
			if h, err := cs.Header(); err == nil {
				if h = hamsmd.Forwardable(h); len(h) > 0 {
					_ = ss.SetHeader(h)
				}
			}
			headerSent = true
		}
		b, err := r.toClient(m.ProtoReflect().GetUnknown(), p, client)
		if err != nil {
			return status.Errorf(codes.Internal, "%s: backend answer: %v", method, err)
		}
		if err := ss.SendMsg(rawMessage(b)); err != nil {
			return err
		}
	}
}

// unknownGate is the first stream interceptor of the frontend's server:
// a call of a method the server has neither a handler (srv is nil only
// for the unknown-method handler) nor a raw route for is answered
// Unimplemented before the metrics and logging interceptors see it, so
// arbitrary method names (scanners, probes of other services) make no
// metric series and no log lines.
func unknownGate(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if srv == nil {
		if _, ok := rawRoutes[info.FullMethod]; !ok || internalMethod(info.FullMethod) {
			return status.Errorf(codes.Unimplemented, "method %s is not served by the HAMS frontend", info.FullMethod)
		}
	}
	return handler(srv, ss)
}

// internalServices are HAMS's internal gRPC services: never served, nor
// passed through, on the client port (the frontend serves Dataplane and
// Replication on its internal listener only).
var internalServices = []string{
	hamsv1.Dataplane_ServiceDesc.ServiceName,
	hamsv1.Replication_ServiceDesc.ServiceName,
	hamsv1.Manager_ServiceDesc.ServiceName,
	hamsv1.ModelRuntime_ServiceDesc.ServiceName,
}

// internalMethod says whether a full method name ("/pkg.Service/Method")
// is one of an internal service.
func internalMethod(method string) bool {
	svc, _, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	return slices.Contains(internalServices, svc)
}
