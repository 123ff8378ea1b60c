package clipperstub

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/refserver/models"
)

const depClassifier = `
name: c
models:
  - {name: c, kind: classifier}
services:
  - {name: c, edges: [[frontend, c], [c, frontend]]}
`

func TestClipperStubPredict(t *testing.T) {
	d, err := config.Parse([]byte(depClassifier))
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.New(d.Model("c"))
	if err != nil {
		t.Fatal(err)
	}
	app, err := NewApp(m)
	if err != nil {
		t.Fatal(err)
	}
	row := make([]float32, 784)
	outs, err := app.Predict([][]float32{row, row})
	if err != nil || len(outs) != 2 || len(outs[0]) != 10 {
		t.Fatalf("predict: %v %v", outs, err)
	}
	for _, bad := range [][][]float32{nil, {{}}, {row, row[:5]}, {row[:5]}} {
		if _, err := app.Predict(bad); err == nil {
			t.Fatalf("bad rows %d accepted", len(bad))
		}
	}
	h := Handler(map[string]*App{"c": app})
	post := func(path, body string) (int, map[string]any) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewBufferString(body)))
		var out map[string]any
		json.Unmarshal(rec.Body.Bytes(), &out)
		return rec.Code, out
	}
	rb, _ := json.Marshal(map[string]any{"input": row})
	if code, out := post("/c/predict", string(rb)); code != 200 || out["output"] == nil || out["default"] != false {
		t.Fatalf("single: %d %v", code, out)
	}
	bb, _ := json.Marshal(map[string]any{"input_batch": [][]float32{row, row, row}})
	if code, out := post("/c/predict", string(bb)); code != 200 || len(out["batch_predictions"].([]any)) != 3 {
		t.Fatalf("batch: %d %v", code, out)
	}
	if code, out := post("/nope/predict", string(rb)); code != 404 || out["error"] == nil {
		t.Fatalf("unknown app: %d %v", code, out)
	}
	if code, _ := post("/c/predict", "{"); code != 400 {
		t.Fatalf("bad body: %d", code)
	}
	if code, out := post("/c/predict", `{"input":[1,2,3]}`); code != 400 || out["cause"] == nil {
		t.Fatalf("wrong width: %d %v", code, out)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("metrics: %d", rec.Code)
	}
}
