// Package clipperstub serves a Clipper query frontend's REST API (the
// subset adapters/clipper uses: POST /{app}/predict with {"input": row} or
// {"input_batch": [rows]}, GET /metrics) for reference models, one
// application per model. It is test support, not Clipper: there is no
// Clipper process to start on a machine without Docker, so `hams
// clipper-stub` (up, demo and bench start it for a clipper model without
// a backend.address) and the adapter benchmarks run this. The model runs
// in this process (refserver/models), so it costs what a
// Clipper model container reached through its query frontend costs minus
// Clipper's own RPC hop to the container.
package clipperstub

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/models"
)

// App is one model served as a Clipper application: every request's rows
// run as one batch, the model's first input fed with them (FP32).
type App struct {
	mu    sync.Mutex // the batch ids of a model are dense
	m     models.Model
	in    string
	dt    string
	batch uint64
}

// NewApp serves m (its first declared input takes the rows).
func NewApp(m models.Model) (*App, error) {
	d := m.Describe()
	if len(d.GetInputs()) == 0 || len(d.GetOutputs()) == 0 {
		return nil, fmt.Errorf("clipperstub: model %q declares no input or no output", d.GetName())
	}
	return &App{m: m, in: d.GetInputs()[0].GetName(), dt: d.GetInputs()[0].GetDatatype()}, nil
}

// Handler serves apps (by application name) over the Clipper REST subset.
func Handler(apps map[string]*App) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"stub":"hams clipper-stub"}`)
	})
	var qid atomic.Int64
	mux.HandleFunc("POST /{app}/predict", func(w http.ResponseWriter, req *http.Request) {
		app := apps[req.PathValue("app")]
		if app == nil {
			stubErr(w, http.StatusNotFound, "unknown application", req.PathValue("app"))
			return
		}
		var body struct {
			Input      []float32   `json:"input"`
			InputBatch [][]float32 `json:"input_batch"`
		}
		if err := json.NewDecoder(io.LimitReader(req.Body, 64<<20)).Decode(&body); err != nil {
			stubErr(w, http.StatusBadRequest, "bad request body", err.Error())
			return
		}
		rows, single := body.InputBatch, body.InputBatch == nil
		if single {
			rows = [][]float32{body.Input}
		}
		outs, err := app.Predict(rows)
		if err != nil {
			stubErr(w, http.StatusBadRequest, "prediction failed", err.Error())
			return
		}
		type ans struct {
			QueryID int64     `json:"query_id"`
			Output  []float32 `json:"output"`
			Default bool      `json:"default"`
		}
		w.Header().Set("Content-Type", "application/json")
		if single {
			json.NewEncoder(w).Encode(ans{QueryID: qid.Add(1), Output: outs[0]})
			return
		}
		bp := make([]ans, len(outs))
		for i, o := range outs {
			bp[i] = ans{QueryID: qid.Add(1), Output: o}
		}
		json.NewEncoder(w).Encode(map[string]any{"batch_predictions": bp})
	})
	return mux
}

func stubErr(w http.ResponseWriter, code int, msg, cause string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": msg, "cause": cause})
}

// Predict runs rows (each one request) as one batch and returns each
// row's first output row flattened.
func (a *App) Predict(rows [][]float32) ([][]float32, error) {
	if len(rows) == 0 || len(rows[0]) == 0 {
		return nil, fmt.Errorf("no input rows")
	}
	if a.dt != "" && a.dt != tensor.FP32 {
		return nil, fmt.Errorf("input %q is %s; the stub sends FP32 only", a.in, a.dt)
	}
	w := len(rows[0])
	flat := make([]float32, 0, w*len(rows))
	per := make([]uint32, len(rows))
	for i, r := range rows {
		if len(r) != w {
			return nil, fmt.Errorf("row %d has %d values, row 0 has %d", i, len(r), w)
		}
		flat = append(flat, r...)
		per[i] = 1
	}
	a.mu.Lock()
	a.batch++
	res, err := a.m.Infer(&models.Batch{Inputs: []*hamsv1.Tensor{tensor.FromFloat32(a.in, []int64{int64(len(rows)), int64(w)}, flat)},
		Rows: per, StreamIDs: make([]string, len(rows)), BatchID: a.batch})
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if len(res.Outputs) == 0 {
		return nil, fmt.Errorf("model answered no output")
	}
	v, err := tensor.Float32(res.Outputs[0])
	if err != nil {
		return nil, fmt.Errorf("output %q: %w", res.Outputs[0].GetName(), err)
	}
	if len(v)%len(rows) != 0 {
		return nil, fmt.Errorf("output of %d values for %d rows", len(v), len(rows))
	}
	d := len(v) / len(rows)
	out := make([][]float32, len(rows))
	for i := range out {
		out[i] = v[i*d : (i+1)*d]
	}
	return out, nil
}
