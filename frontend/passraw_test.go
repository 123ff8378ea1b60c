package frontend

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/testing/backendtest"
)

// Raw messages at the upstream field numbers (passraw.go's table).
func pbStr(b []byte, n protowire.Number, s string) []byte {
	return protowire.AppendString(protowire.AppendTag(b, n, protowire.BytesType), s)
}

func pbMsg(b []byte, n protowire.Number, m []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, n, protowire.BytesType), m)
}

func rawOf(b []byte) *emptypb.Empty { return rawMessage(b) }

func rawBytes(m *emptypb.Empty) []byte { return m.ProtoReflect().GetUnknown() }

// passRawClient dials the frontend as a client of methods outside the
// proto subset does (raw messages, the default proto codec).
func passRawClient(t *testing.T, e *env) *grpc.ClientConn {
	t.Helper()
	addr := e.grpcAddr
	cc, err := grpcx.Dial(addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// The model-scoped methods outside the frontend's proto subset reach a
// pass-through model's backend as TF Serving's and Triton's clients send
// them: the same bytes but the model name (the backend's), the
// deployment's version and signature filled in where the client gave
// none, the client's metadata and HAMS's identity; the answers, header and
// trailer come back with the client's model name.
func TestPassThroughRawMethods(t *testing.T) {
	e, bt := passEnv(t)
	cc := passRawClient(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bt.SetRaw(func(method string, req []byte) []byte {
		switch method {
		case "/tensorflow.serving.PredictionService/Classify":
			// ClassificationResponse{result 1, model_spec 2{name 1}}
			return pbMsg(pbMsg(nil, 1, []byte("result")), 2, pbStr(nil, 1, "tf_model"))
		case "/inference.GRPCInferenceService/ModelConfig":
			// ModelConfigResponse{config 1: ModelConfig{name 1, platform 2}}
			return pbMsg(nil, 1, pbStr(pbStr(nil, 1, "ks_model"), 2, "tensorrt_plan"))
		}
		// ModelStreamInferResponse{infer_response 2: {model_name 1, id 3}}
		id, _ := getString(req, 3)
		return pbMsg(nil, 2, pbStr(pbStr(nil, 1, "ks_model"), 3, id))
	})

	// Classify: ClassificationRequest{model_spec 1{name 1}, input 2} and a
	// field of a newer release (99).
	input := pbStr(nil, 1, "examples")
	req := pbMsg(pbMsg(nil, 1, pbStr(nil, 1, "tfm")), 2, input)
	req = protowire.AppendVarint(protowire.AppendTag(req, 99, protowire.VarintType), 7)
	var header, trailer metadata.MD
	out := &emptypb.Empty{}
	octx := metadata.AppendToOutgoingContext(ctx, "x-client", "c1")
	if err := cc.Invoke(octx, "/tensorflow.serving.PredictionService/Classify", rawOf(req), out, grpc.Header(&header), grpc.Trailer(&trailer)); err != nil {
		t.Fatal(err)
	}
	c, ok := bt.Last("/tensorflow.serving.PredictionService/Classify")
	if !ok {
		t.Fatal("Classify did not reach the backend")
	}
	var spec []byte
	_, _ = mapAt(c.Raw, []protowire.Number{1}, func(m []byte) ([]byte, error) { spec = m; return m, nil })
	if n, _ := getString(spec, 1); n != "tf_model" {
		t.Fatalf("backend got model %q", n)
	}
	// backend.signature is Predict's: a Classify without a signature gets
	// the model's default, as from TF Serving directly.
	if has(spec, 3) {
		t.Fatalf("backend got a signature: %x", spec)
	}
	if in, _ := getString(c.Raw, 2); in != string(input) || !has(c.Raw, 99) {
		t.Fatalf("the request's other fields changed: %x", c.Raw)
	}
	if c.MD.Get("x-client")[0] != "c1" {
		t.Fatalf("client metadata lost: %v", c.MD)
	}
	identityOf(t, c)
	var rspec []byte
	_, _ = mapAt(rawBytes(out), []protowire.Number{2}, func(m []byte) ([]byte, error) { rspec = m; return m, nil })
	if n, _ := getString(rspec, 1); n != "tfm" {
		t.Fatalf("answer names model %q, want the client's tfm", n)
	}
	if r, _ := getString(rawBytes(out), 1); r != "result" {
		t.Fatalf("answer's result changed: %x", rawBytes(out))
	}
	if len(header.Get(backendtest.HeaderKey)) == 0 || len(trailer.Get(backendtest.TrailerKey)) == 0 {
		t.Fatalf("backend header %v / trailer %v did not come back", header, trailer)
	}

	// ModelConfig: the version is the deployment's when none is given.
	out = &emptypb.Empty{}
	if err := cc.Invoke(ctx, "/inference.GRPCInferenceService/ModelConfig", rawOf(pbStr(nil, 1, "ksm")), out); err != nil {
		t.Fatal(err)
	}
	c, _ = bt.Last("/inference.GRPCInferenceService/ModelConfig")
	if n, _ := getString(c.Raw, 1); n != "ks_model" {
		t.Fatalf("ModelConfig named %q at the backend", n)
	}
	if v, _ := getString(c.Raw, 2); v != "3" {
		t.Fatalf("ModelConfig version %q, want the deployment's 3", v)
	}
	var cfg []byte
	_, _ = mapAt(rawBytes(out), []protowire.Number{1}, func(m []byte) ([]byte, error) { cfg = m; return m, nil })
	if n, _ := getString(cfg, 1); n != "ksm" {
		t.Fatalf("ModelConfig answer names %q", n)
	}
	if p, _ := getString(cfg, 2); p != "tensorrt_plan" {
		t.Fatalf("ModelConfig answer changed: %x", rawBytes(out))
	}

	// ModelStreamInfer: every request of the stream reaches the backend,
	// every answer comes back, renamed.
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/inference.GRPCInferenceService/ModelStreamInfer")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"r1", "r2", "r3"} {
		if err := st.SendMsg(rawOf(pbStr(pbStr(nil, 1, "ksm"), 3, id))); err != nil {
			t.Fatal(err)
		}
		got := &emptypb.Empty{}
		if err := st.RecvMsg(got); err != nil {
			t.Fatal(err)
		}
		var ir []byte
		_, _ = mapAt(rawBytes(got), []protowire.Number{2}, func(m []byte) ([]byte, error) { ir = m; return m, nil })
		if n, _ := getString(ir, 1); n != "ksm" {
			t.Fatalf("stream answer names %q", n)
		}
		if i, _ := getString(ir, 3); i != id {
			t.Fatalf("stream answer id %q, want %q", i, id)
		}
	}
	_ = st.CloseSend()
	if err := st.RecvMsg(&emptypb.Empty{}); !errors.Is(err, io.EOF) {
		t.Fatalf("stream end: %v", err)
	}
	n := 0
	for _, c := range bt.Calls() {
		if c.Method == "/inference.GRPCInferenceService/ModelStreamInfer" {
			if v, _ := getString(c.Raw, 2); v != "3" || !bytes.Contains(c.Raw, []byte("ks_model")) {
				t.Fatalf("stream request at the backend: %x", c.Raw)
			}
			n++
		}
	}
	if n != 3 {
		t.Fatalf("%d stream requests reached the backend, want 3", n)
	}

	// A stream closed before its first request ends OK, as Triton ends it.
	st, err = cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/inference.GRPCInferenceService/ModelStreamInfer")
	if err != nil {
		t.Fatal(err)
	}
	_ = st.CloseSend()
	if err := st.RecvMsg(&emptypb.Empty{}); !errors.Is(err, io.EOF) {
		t.Fatalf("empty stream: %v, want a clean end", err)
	}

	// A stream request naming another model ends the stream.
	st, err = cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/inference.GRPCInferenceService/ModelStreamInfer")
	if err != nil {
		t.Fatal(err)
	}
	_ = st.SendMsg(rawOf(pbStr(pbStr(nil, 1, "ksm"), 3, "a")))
	_ = st.RecvMsg(&emptypb.Empty{})
	_ = st.SendMsg(rawOf(pbStr(nil, 1, "gone")))
	var serr error
	for serr == nil {
		serr = st.RecvMsg(&emptypb.Empty{})
	}
	wantStatus(t, "stream switching models", serr, codes.InvalidArgument, `"gone"`, `"ksm"`)

	// What is not forwarded.
	for _, c := range []struct {
		what, method string
		req          []byte
		code         codes.Code
		says         string
	}{
		{"HA model", "/inference.GRPCInferenceService/ModelConfig", pbStr(nil, 1, "echo"), codes.Unimplemented, "HAMS path"},
		{"unknown model", "/inference.GRPCInferenceService/ModelConfig", pbStr(nil, 1, "nope"), codes.NotFound, "nope"},
		{"no model", "/inference.GRPCInferenceService/ModelStatistics", nil, codes.InvalidArgument, "no model"},
		{"wrong API", "/tensorflow.serving.PredictionService/Regress", pbMsg(nil, 1, pbStr(nil, 1, "ksm")), codes.Unimplemented, "KServe"},
		{"server-wide", "/inference.GRPCInferenceService/RepositoryIndex", nil, codes.Unimplemented, "RepositoryIndex"},
		{"other service", "/grpc.channelz.v1.Channelz/GetTopChannels", nil, codes.Unimplemented, "not served"},
		{"two models", "/tensorflow.serving.PredictionService/MultiInference",
			pbMsg(pbMsg(nil, 1, pbMsg(nil, 1, pbStr(nil, 1, "tfm"))), 1, pbMsg(nil, 1, pbStr(nil, 1, "tfs"))), codes.InvalidArgument, "one model"},
		{"malformed", "/inference.GRPCInferenceService/ModelConfig", []byte{0x0a, 0x05, 'k'}, codes.Internal, ""},
	} {
		err := cc.Invoke(ctx, c.method, rawOf(c.req), &emptypb.Empty{})
		if c.what == "malformed" {
			// A truncated message is refused by the server's own decoder.
			if err == nil {
				t.Fatalf("%s: accepted", c.what)
			}
			continue
		}
		wantStatus(t, c.what, err, c.code, c.says)
	}
	// The unknown method was answered before the metrics saw it: no series
	// names it (the raw routes' do).
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "grpc_method" {
					seen[l.GetValue()] = true
				}
			}
		}
	}
	if seen["ServerReflectionInfo"] || !seen["ModelStreamInfer"] {
		t.Fatalf("metric series by method: %v", seen)
	}
}
