package clipper

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// The two benchmarks send the same batch-1 request (784 floats, the
// Fashion-MNIST shape) to the fake query frontend: directly as a Clipper
// client would (JSON encode, POST, decode), and through the adapter
// (tensor to JSON rows, POST, answer to tensor). The difference is the
// adapter's own cost per call.

func row784() []float32 {
	v := make([]float32, 784)
	for i := range v {
		v[i] = float32(i%255) / 255
	}
	return v
}

func BenchmarkDirectPredict(b *testing.B) {
	_, srv := startFake(b)
	client := &http.Client{}
	row := row784()
	b.ReportAllocs()
	for b.Loop() {
		body, err := json.Marshal(map[string][]float32{"input": row})
		if err != nil {
			b.Fatal(err)
		}
		resp, err := client.Post(srv.URL+"/sum/predict", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			b.Fatal(resp.Status, err)
		}
		var a struct {
			Output  float64 `json:"output"`
			Default bool    `json:"default"`
		}
		if err := json.Unmarshal(data, &a); err != nil || a.Default {
			b.Fatal(string(data), err)
		}
	}
}

func BenchmarkAdapterInfer(b *testing.B) {
	_, srv := startFake(b)
	be := newB(b, srv.URL, nil)
	row := row784()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		req := &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("input", []int64{1, 784}, row)}, Rows: []uint32{1}}
		if _, err := be.Infer(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
