package integration

import (
	"context"
	"math"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/internal/loadgen"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// retrofitImages returns n Fashion-MNIST test images (rows of 784 pixels
// in 0..1) when the dataset is installed, else n seeded random images.
func retrofitImages(t *testing.T, n int) [][]float32 {
	t.Helper()
	if d := loadgen.Fashion(); d != nil && len(d.Images) >= n {
		t.Logf("retrofit: %d Fashion-MNIST test images from %s", n, loadgen.FashionDir)
		return d.Images[:n]
	}
	t.Logf("retrofit: Fashion-MNIST not installed under %s: %d seeded random images", loadgen.FashionDir, n)
	rng := rand.New(rand.NewPCG(7, 11))
	out := make([][]float32, n)
	for i := range out {
		out[i] = make([]float32, 784)
		for j := range out[i] {
			out[i][j] = rng.Float32()
		}
	}
	return out
}

// flat concatenates rows.
func flat(rows [][]float32) []float32 {
	var out []float32
	for _, r := range rows {
		out = append(out, r...)
	}
	return out
}

// tfImages is the TF Serving form of rows as images [N,784]; typed puts
// the pixels in float_val, else in tensor_content.
func tfImages(rows [][]float32, typed bool) *tfpb.TensorProto {
	v := flat(rows)
	tp := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: &tfpb.TensorShapeProto{Dim: []*tfpb.TensorShapeProto_Dim{{Size: int64(len(rows))}, {Size: 784}}}}
	if typed {
		tp.FloatVal = v
	} else {
		tp.TensorContent = tensor.FromFloat32("images", nil, v).Data
	}
	return tp
}

// tfScores reads the scores output of a TF Serving reply.
func tfScores(t *testing.T, resp *tfapis.PredictResponse) []float32 {
	t.Helper()
	tp := resp.GetOutputs()["scores"]
	if tp == nil {
		t.Fatalf("TF Serving reply without scores: outputs %v", keysOf(resp.GetOutputs()))
	}
	if tp.GetDtype() != tfpb.DataType_DT_FLOAT {
		t.Fatalf("scores dtype %v", tp.GetDtype())
	}
	if len(tp.GetTensorContent()) > 0 {
		v, err := tensor.Float32(&hamsv1.Tensor{Name: "scores", Datatype: tensor.FP32, Shape: []int64{int64(len(tp.GetTensorContent()) / 4)}, Data: tp.GetTensorContent()})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return tp.GetFloatVal()
}

func keysOf[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// ksRequest is a KServe v2 request for rows: raw_input_contents or typed
// fp32_contents.
func ksRequest(model string, rows [][]float32, raw bool) *inference.ModelInferRequest {
	v := flat(rows)
	in := &inference.ModelInferRequest_InferInputTensor{Name: "images", Datatype: "FP32", Shape: []int64{int64(len(rows)), 784}}
	req := &inference.ModelInferRequest{ModelName: model, Inputs: []*inference.ModelInferRequest_InferInputTensor{in}}
	if raw {
		req.RawInputContents = [][]byte{tensor.FromFloat32("images", nil, v).Data}
	} else {
		in.Contents = &inference.InferTensorContents{Fp32Contents: v}
	}
	return req
}

// ksScores reads the scores output of a KServe v2 reply (raw or typed).
func ksScores(t *testing.T, resp *inference.ModelInferResponse) []float32 {
	t.Helper()
	for i, o := range resp.GetOutputs() {
		if o.GetName() != "scores" {
			continue
		}
		if o.GetDatatype() != "FP32" {
			t.Fatalf("scores datatype %s", o.GetDatatype())
		}
		if i < len(resp.GetRawOutputContents()) && len(resp.GetRawOutputContents()[i]) > 0 {
			v, err := tensor.Float32(&hamsv1.Tensor{Name: "scores", Datatype: tensor.FP32, Shape: o.GetShape(), Data: resp.GetRawOutputContents()[i]})
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		return o.GetContents().GetFp32Contents()
	}
	t.Fatalf("KServe reply without scores: %v", resp.GetOutputs())
	return nil
}

// sameScores: one row of 10 scores per image, argmax equal row by row and
// every score within tol (the models are non-deterministic in low bits).
func sameScores(got, want []float32, rows int, tol float64) (bool, string) {
	if len(got) != rows*10 || len(want) != rows*10 {
		return false, "wrong number of scores"
	}
	for r := range rows {
		g, w := got[r*10:(r+1)*10], want[r*10:(r+1)*10]
		if argmax(g) != argmax(w) {
			return false, "argmax differs"
		}
		for j := range g {
			if math.Abs(float64(g[j]-w[j])) > tol {
				return false, "score differs by more than the tolerance"
			}
		}
	}
	return true, ""
}

func argmax(v []float32) int {
	best := 0
	for i := range v {
		if v[i] > v[best] {
			best = i
		}
	}
	return best
}

// activeBackend finds the model server of model's serving (ACTIVE or
// PRIMARY) instance in the manager's topology.
func activeBackend(t *testing.T, manager, model string) string {
	t.Helper()
	cc := dialInternal(t, manager, operator)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	topo, err := hamsv1.NewManagerClient(cc).GetTopology(ctx, &hamsv1.GetTopologyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range topo.GetPlacements() {
		if p.GetModel() == model && p.GetAlive() && p.GetSidecarAddress() != "" && p.GetBackendAddress() != "" &&
			(p.GetRole() == hamsv1.Role_ROLE_ACTIVE || p.GetRole() == hamsv1.Role_ROLE_PRIMARY) {
			return p.GetBackendAddress()
		}
	}
	t.Fatalf("no serving instance of %s with a backend address in the topology %v", model, topo.GetPlacements())
	return ""
}

// TestRetrofitUp: `hams up --config examples/retrofit.yaml` serves the
// fashion classifier through its TF Serving- and KServe v2-compatible
// endpoints; clients using only those APIs get the predictions the model
// server gives when called directly (argmax equal, scores within 1e-4), in
// every content form; bad requests fail with the right code and name the
// tensor while good requests keep succeeding.
func TestRetrofitUp(t *testing.T) {
	cfgPath, _ := filepath.Abs("../examples/retrofit.yaml")
	// The first frontend on addresses of our choosing (what a container
	// publishes).
	feGRPC, feHTTP := freeAddr(t), freeAddr(t)
	up := startHams(t, 90*time.Second, "up", "--config", cfgPath, "--run-dir", t.TempDir(), "--suspicion-timeout", suspicion,
		"--frontend-listen", feGRPC, "--frontend-http", feHTTP)
	if g, h := up.str(t, "frontend_grpc"), up.str(t, "frontend_http"); g != feGRPC || h != feHTTP {
		t.Fatalf("frontend on %s / %s, asked for %s / %s", g, h, feGRPC, feHTTP)
	}
	tfAddr, ksAddr := up.str(t, "tfserving_grpc"), up.str(t, "kserve_grpc")
	direct := activeBackend(t, up.str(t, "manager"), "fashion")
	t.Logf("retrofit: tfserving_grpc %s, kserve_grpc %s, model server (direct) %s", tfAddr, ksAddr, direct)

	dial := func(a string) *tfapisConns {
		cc := dialInternal(t, a, operator)
		t.Cleanup(func() { cc.Close() })
		return &tfapisConns{tf: tfapis.NewPredictionServiceClient(cc), ks: inference.NewGRPCInferenceServiceClient(cc)}
	}
	viaTF, viaKS, dir := dial(tfAddr), dial(ksAddr), dial(direct)
	ctx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 10*time.Second)
	}
	spec := &tfapis.ModelSpec{Name: "fashion"}

	images := retrofitImages(t, 96)
	const tol = 1e-4
	// Batches of 1, 2 and 5 images, each through every path.
	type batch struct {
		rows [][]float32
		want []float32 // the model server's own TF Serving answer
	}
	var batches []batch
	for i := 0; i < len(images); {
		n := []int{1, 2, 5}[len(batches)%3]
		n = min(n, len(images)-i)
		b := batch{rows: images[i : i+n]}
		c, cancel := ctx()
		resp, err := dir.tf.Predict(c, &tfapis.PredictRequest{ModelSpec: spec, Inputs: map[string]*tfpb.TensorProto{"images": tfImages(b.rows, false)}})
		cancel()
		if err != nil {
			t.Fatalf("direct TF Serving Predict at the model server: %v", err)
		}
		b.want = tfScores(t, resp)
		batches = append(batches, b)
		i += n
	}
	// The model server's KServe v2 answer agrees with its TF Serving one.
	for _, b := range batches[:6] {
		c, cancel := ctx()
		resp, err := dir.ks.ModelInfer(c, ksRequest("fashion", b.rows, true))
		cancel()
		if err != nil {
			t.Fatalf("direct KServe ModelInfer: %v", err)
		}
		if ok, why := sameScores(ksScores(t, resp), b.want, len(b.rows), tol); !ok {
			t.Fatalf("model server: KServe and TF Serving answers disagree: %s", why)
		}
	}

	// Good traffic through the TF Serving API in the background for the
	// whole test: every reply must match the direct answer.
	stop := make(chan struct{})
	var bgOK, bgBad atomic.Int64
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				b := batches[i%len(batches)]
				c, cancel := ctx()
				resp, err := viaTF.tf.Predict(c, &tfapis.PredictRequest{ModelSpec: spec, Inputs: map[string]*tfpb.TensorProto{"images": tfImages(b.rows, i%2 == 0)}})
				cancel()
				if err != nil {
					bgBad.Add(1)
					t.Errorf("background TF Serving Predict: %v", err)
					return
				}
				if ok, why := sameScores(tfScores(t, resp), b.want, len(b.rows), tol); !ok {
					bgBad.Add(1)
					t.Errorf("background TF Serving Predict: %s", why)
					return
				}
				bgOK.Add(1)
			}
		}()
	}

	matched := map[string]int{}
	for i, b := range batches {
		// TF Serving API: tensor_content and typed float_val.
		for _, typed := range []bool{false, true} {
			c, cancel := ctx()
			resp, err := viaTF.tf.Predict(c, &tfapis.PredictRequest{ModelSpec: spec, Inputs: map[string]*tfpb.TensorProto{"images": tfImages(b.rows, typed)}, OutputFilter: []string{"scores"}})
			cancel()
			if err != nil {
				t.Fatalf("batch %d: TF Serving Predict via HAMS (typed %v): %v", i, typed, err)
			}
			if resp.GetModelSpec().GetName() != "fashion" {
				t.Fatalf("reply model_spec %v", resp.GetModelSpec())
			}
			if ok, why := sameScores(tfScores(t, resp), b.want, len(b.rows), tol); !ok {
				t.Fatalf("batch %d: TF Serving via HAMS vs model server: %s", i, why)
			}
			matched["tfserving"]++
		}
		// KServe v2 API: raw and typed contents.
		for _, raw := range []bool{true, false} {
			c, cancel := ctx()
			resp, err := viaKS.ks.ModelInfer(c, ksRequest("fashion", b.rows, raw))
			cancel()
			if err != nil {
				t.Fatalf("batch %d: KServe ModelInfer via HAMS (raw %v): %v", i, raw, err)
			}
			if ok, why := sameScores(ksScores(t, resp), b.want, len(b.rows), tol); !ok {
				t.Fatalf("batch %d: KServe via HAMS vs model server: %s", i, why)
			}
			matched["kserve"]++
		}
	}

	// Metadata names the output the model server names, and a version
	// neither serves is NotFound from both.
	{
		c, cancel := ctx()
		defer cancel()
		outputsOf := func(via *tfapisConns) (string, string) {
			t.Helper()
			md, err := via.tf.GetModelMetadata(c, &tfapis.GetModelMetadataRequest{ModelSpec: spec, MetadataField: []string{"signature_def"}})
			if err != nil {
				t.Fatalf("GetModelMetadata: %v", err)
			}
			sigs := &tfapis.SignatureDefMap{}
			if err := md.GetMetadata()["signature_def"].UnmarshalTo(sigs); err != nil {
				t.Fatal(err)
			}
			km, err := via.ks.ModelMetadata(c, &inference.ModelMetadataRequest{Name: "fashion"})
			if err != nil {
				t.Fatalf("ModelMetadata: %v", err)
			}
			var tfOut, ksOut []string
			for n, ti := range sigs.GetSignatureDef()["serving_default"].GetOutputs() {
				tfOut = append(tfOut, n+":"+ti.GetDtype().String())
			}
			for _, o := range km.GetOutputs() {
				ksOut = append(ksOut, o.GetName()+":"+o.GetDatatype())
			}
			return strings.Join(tfOut, ","), strings.Join(ksOut, ",")
		}
		dtf, dks := outputsOf(dir)
		htf, hks := outputsOf(viaTF)
		if dtf != htf || dks != hks || htf == "" || hks == "" {
			t.Fatalf("metadata outputs: model server %q / %q, via HAMS %q / %q", dtf, dks, htf, hks)
		}
		for _, via := range []*tfapisConns{dir, viaTF} {
			_, err := via.tf.Predict(c, &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion", VersionChoice: &tfapis.ModelSpec_Version{Version: wrapperspb.Int64(9)}},
				Inputs: map[string]*tfpb.TensorProto{"images": tfImages(batches[0].rows, false)}})
			if status.Code(err) != codes.NotFound {
				t.Fatalf("Predict of version 9: %v, want NotFound", err)
			}
			_, err = via.ks.ModelInfer(c, &inference.ModelInferRequest{ModelName: "fashion", ModelVersion: "9"})
			if status.Code(err) != codes.NotFound {
				t.Fatalf("ModelInfer of version 9: %v, want NotFound", err)
			}
		}
	}

	// Bad input through both APIs, each followed by a good request.
	good := func() {
		t.Helper()
		b := batches[0]
		c, cancel := ctx()
		defer cancel()
		resp, err := viaKS.ks.ModelInfer(c, ksRequest("fashion", b.rows, true))
		if err != nil {
			t.Fatalf("good request after a bad one: %v", err)
		}
		if ok, why := sameScores(ksScores(t, resp), b.want, len(b.rows), tol); !ok {
			t.Fatalf("good request after a bad one: %s", why)
		}
	}
	expect := func(what string, err error, code codes.Code, mention string) {
		t.Helper()
		if status.Code(err) != code {
			t.Fatalf("%s: %v, want %v", what, err, code)
		}
		if mention != "" && !strings.Contains(status.Convert(err).Message(), mention) {
			t.Fatalf("%s: message %q does not name %q", what, status.Convert(err).Message(), mention)
		}
		good()
	}
	one := batches[0].rows
	tfCall := func(req *tfapis.PredictRequest) error {
		c, cancel := ctx()
		defer cancel()
		_, err := viaTF.tf.Predict(c, req)
		return err
	}
	ksCall := func(req *inference.ModelInferRequest) error {
		c, cancel := ctx()
		defer cancel()
		_, err := viaKS.ks.ModelInfer(c, req)
		return err
	}
	in := func(tp *tfpb.TensorProto) map[string]*tfpb.TensorProto {
		return map[string]*tfpb.TensorProto{"images": tp}
	}

	// Unknown model.
	expect("TF: unknown model", tfCall(&tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "no-such-model"}, Inputs: in(tfImages(one, false))}), codes.NotFound, "no-such-model")
	expect("KServe: unknown model", ksCall(ksRequest("no-such-model", one, true)), codes.NotFound, "no-such-model")
	// Wrong dtype (DT_DOUBLE / FP64 for an FP32 input).
	dbl := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_DOUBLE, TensorShape: tfImages(one, true).TensorShape, DoubleVal: make([]float64, 784)}
	expect("TF: wrong dtype", tfCall(&tfapis.PredictRequest{ModelSpec: spec, Inputs: in(dbl)}), codes.InvalidArgument, "images")
	ksDbl := &inference.ModelInferRequest{ModelName: "fashion", Inputs: []*inference.ModelInferRequest_InferInputTensor{{Name: "images", Datatype: "FP64", Shape: []int64{1, 784},
		Contents: &inference.InferTensorContents{Fp64Contents: make([]float64, 784)}}}}
	expect("KServe: wrong dtype", ksCall(ksDbl), codes.InvalidArgument, "images")
	// Wrong shape ([1,783]; [784] without the batch dimension).
	short := tfImages(one, true)
	short.TensorShape.Dim[1].Size = 783
	short.FloatVal = short.FloatVal[:783]
	expect("TF: wrong shape", tfCall(&tfapis.PredictRequest{ModelSpec: spec, Inputs: in(short)}), codes.InvalidArgument, "images")
	ksShort := ksRequest("fashion", one, false)
	ksShort.Inputs[0].Shape = []int64{784}
	expect("KServe: wrong shape", ksCall(ksShort), codes.InvalidArgument, "images")
	// Contents that do not match the shape.
	trunc := ksRequest("fashion", one, true)
	trunc.RawInputContents[0] = trunc.RawInputContents[0][:100]
	expect("KServe: raw contents shorter than the shape", ksCall(trunc), codes.InvalidArgument, "images")
	// Unsupported dtypes (no HAMS tensor form).
	cplx := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_COMPLEX64, TensorShape: tfImages(one, true).TensorShape, ScomplexVal: make([]float32, 2*784)}
	expect("TF: unsupported dtype", tfCall(&tfapis.PredictRequest{ModelSpec: spec, Inputs: in(cplx)}), codes.InvalidArgument, "images")
	ksBad := ksRequest("fashion", one, true)
	ksBad.Inputs[0].Datatype = "FP99"
	expect("KServe: unsupported datatype", ksCall(ksBad), codes.InvalidArgument, "images")
	// Unknown input name.
	expect("TF: unknown input", tfCall(&tfapis.PredictRequest{ModelSpec: spec, Inputs: map[string]*tfpb.TensorProto{"pixels": tfImages(one, false)}}), codes.InvalidArgument, "")

	close(stop)
	wg.Wait()
	if bgBad.Load() != 0 || bgOK.Load() == 0 {
		t.Fatalf("background TF Serving traffic: %d matched, %d failed", bgOK.Load(), bgBad.Load())
	}
	t.Logf("retrofit: %d batches matched via the TF Serving API, %d via KServe v2, %d background TF Serving requests matched during the bad-input phase",
		matched["tfserving"], matched["kserve"], bgOK.Load())
	up.stop(t, 20*time.Second)
}

type tfapisConns struct {
	tf tfapis.PredictionServiceClient
	ks inference.GRPCInferenceServiceClient
}

// freeAddr is a loopback address with a port nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
