package frontend

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func TestBadInputsGRPC(t *testing.T) {
	e := newEnv(t, "5s")
	good := func() []*hamsv1.Tensor { return echoInputs(2, 1) }
	with := func(mod func(in []*hamsv1.Tensor) []*hamsv1.Tensor) []*hamsv1.Tensor { return mod(good()) }
	cases := []struct {
		name    string
		service string
		inputs  []*hamsv1.Tensor
		code    codes.Code
		msg     []string
	}{
		{"missing service", "", good(), codes.InvalidArgument, []string{"missing service"}},
		{"unknown service", "nope", good(), codes.NotFound, []string{`"nope"`}},
		{"no inputs", "echo", nil, codes.InvalidArgument, []string{"no input"}},
		{"missing input", "echo", good()[:1], codes.InvalidArgument, []string{"missing input", `"ids"`}},
		{"unknown input", "echo", append(good(), tensor.FromInt64("zzz", []int64{1}, []int64{1})), codes.InvalidArgument, []string{"unknown input", `"zzz"`}},
		{"duplicate input", "echo", append(good(), tensor.FromInt64("ids", []int64{1}, []int64{1})), codes.InvalidArgument, []string{`"ids"`, "twice"}},
		{"unnamed input", "echo", append(good(), tensor.FromInt64("", []int64{1}, []int64{1})), codes.InvalidArgument, []string{"input 2 has no name"}},
		{"wrong datatype", "echo", with(func(in []*hamsv1.Tensor) []*hamsv1.Tensor {
			in[0] = &hamsv1.Tensor{Name: "images", Datatype: "FP64", Shape: []int64{1, 4}, Data: make([]byte, 32)}
			return in
		}), codes.InvalidArgument, []string{`"images"`, "FP64", "FP32"}},
		{"wrong rank", "echo", with(func(in []*hamsv1.Tensor) []*hamsv1.Tensor {
			in[0] = tensor.FromFloat32("images", []int64{8}, make([]float32, 8))
			return in
		}), codes.InvalidArgument, []string{`"images"`, "rank"}},
		{"wrong dimension", "echo", with(func(in []*hamsv1.Tensor) []*hamsv1.Tensor {
			in[0] = tensor.FromFloat32("images", []int64{2, 5}, make([]float32, 10))
			return in
		}), codes.InvalidArgument, []string{`"images"`, "dimension 1"}},
		{"data length", "echo", with(func(in []*hamsv1.Tensor) []*hamsv1.Tensor {
			in[0].Data = in[0].Data[:len(in[0].Data)-4]
			return in
		}), codes.InvalidArgument, []string{`"images"`, "bytes"}},
		{"negative dimension", "echo", with(func(in []*hamsv1.Tensor) []*hamsv1.Tensor {
			in[1] = &hamsv1.Tensor{Name: "ids", Datatype: "INT64", Shape: []int64{-2}}
			return in
		}), codes.InvalidArgument, []string{`"ids"`}},
		{"unknown datatype (no declared inputs)", "fan", []*hamsv1.Tensor{{Name: "v", Datatype: "FOO", Shape: []int64{1}, Data: []byte{1}}},
			codes.InvalidArgument, []string{`"v"`, "FOO"}},
		{"item over the limit", "echo", with(func(in []*hamsv1.Tensor) []*hamsv1.Tensor {
			in[0] = tensor.FromFloat32("images", []int64{3950, 4}, make([]float32, 15800))
			return in
		}), codes.ResourceExhausted, []string{`"images"`, "65536-byte"}},
		{"oversized message", "echo", with(func(in []*hamsv1.Tensor) []*hamsv1.Tensor {
			in[0] = tensor.FromFloat32("images", []int64{5000, 4}, make([]float32, 20000))
			return in
		}), codes.ResourceExhausted, []string{"larger than max"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: c.service, Inputs: c.inputs})
			st := status.Convert(err)
			if st.Code() != c.code || !msgHas(st.Message(), c.msg...) {
				t.Fatalf("got %v: %q; want %v naming %q", st.Code(), st.Message(), c.code, c.msg)
			}
			e.mustEcho(float32(i))
		})
	}
	if got := e.models["a"].executed.Load(); got != int64(len(cases)) {
		t.Fatalf("model a executed %d times; only the %d good requests should reach it", got, len(cases))
	}
}

func TestValidateByteCap(t *testing.T) {
	dep, err := config.Parse([]byte(testYAML[:0] + `
models: [{name: a, kind: prep}]
services: [{name: s, edges: [[frontend, a], [a, frontend]]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	s := newServiceInfo(dep, &dep.Services[0])
	in := []*hamsv1.Tensor{
		tensor.FromFloat32("small", []int64{2}, []float32{1, 2}),
		tensor.FromFloat32("big", []int64{4}, []float32{1, 2, 3, 4}),
	}
	if err := s.validateInputs(in, 24); err != nil {
		t.Fatalf("24 bytes within a cap of 24: %v", err)
	}
	err = s.validateInputs(in, 20)
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !msgHas(st.Message(), `"big"`, "20 bytes") {
		t.Fatalf("got %v", err)
	}
}
