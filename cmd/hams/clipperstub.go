package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/hams-go/hams/adapters/refserver/models"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// runClipperStub serves a Clipper query frontend's REST API (the subset
// adapters/clipper uses: POST /{app}/predict with {"input": row} or
// {"input_batch": [rows]}, GET /metrics) for reference models of the
// deployment, one application per model named by its backend.model. It
// is test support, not Clipper: there is no Clipper process to start on
// a machine without Docker, so up, demo and bench run this as the
// backend of a clipper model that has no backend.address, and the bench's
// direct mode calls it over the same REST API the adapter uses. The
// model runs in this process (the refserver's models package), so the
// stub costs what a Clipper model container reached through its query
// frontend costs minus Clipper's own RPC hop to the container.
func runClipperStub(args []string) error {
	rf := newRoleFlags("clipper-stub")
	list := rf.fs.String("models", "", "comma-separated models of the deployment to serve as Clipper applications (required)")
	if err := rf.parse(args); err != nil {
		return err
	}
	names := splitList(*list)
	if len(names) == 0 {
		return usageErr("clipper-stub: --models is required")
	}
	r, err := setupRole("clipper-stub", rf)
	if err != nil {
		return err
	}
	apps := map[string]*stubApp{}
	for _, n := range names {
		mc := r.dep.Model(n)
		if mc == nil {
			r.close()
			return usageErr("clipper-stub: model %q is not in deployment %q", n, r.dep.Name)
		}
		m, err := models.New(mc)
		if err != nil {
			r.close()
			return &exitError{code: 2, err: err}
		}
		d := m.Describe()
		if len(d.GetInputs()) == 0 || len(d.GetOutputs()) == 0 {
			r.close()
			return usageErr("clipper-stub: model %q declares no input or no output", n)
		}
		apps[mc.Backend.Model] = &stubApp{m: m, in: d.GetInputs()[0].GetName(), dt: d.GetInputs()[0].GetDatatype()}
	}
	lis := r.grpc
	r.grpc = nil
	r.fields["http"] = lis.Addr().String()
	delete(r.fields, "grpc")
	r.fields["models"] = names
	mux := stubHandler(apps)
	return r.serve(func(ctx context.Context) error { return grpcx.ServeHTTP(ctx, mux, lis) }, nil, nil)
}

// stubHandler serves apps (by application name) over the Clipper REST
// subset.
func stubHandler(apps map[string]*stubApp) http.Handler {
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
		outs, err := app.predict(rows)
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

// stubApp is one model served as a Clipper application.
type stubApp struct {
	mu    sync.Mutex // the batch ids of a model are dense
	m     models.Model
	in    string
	dt    string
	batch uint64
}

// predict runs rows (each one request) as one batch and returns each
// row's first output row flattened.
func (a *stubApp) predict(rows [][]float32) ([][]float32, error) {
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
