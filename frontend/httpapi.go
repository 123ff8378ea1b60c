package frontend

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// httpAPI is the client HTTP API served on Config.HTTPListener: HAMS's
// own JSON API (http.go), TF Serving's REST API (rest_tfserving.go) and
// KServe v2's HTTP/REST protocol (rest_kserve.go), with the JSON and
// error helpers they share (rest_json.go), plus /healthz and /metrics.
//
// Its one job is translation: it decodes an HTTP request into the
// request message of the frontend's own predict or of a gRPC
// compatibility method (compat.go), has the frontend answer it, and
// writes the answer (or its error) back in the dialect's JSON and status
// codes. It makes no serving decision of its own: model lookup, versions,
// labels, signatures, validation, pass-through, gating and the reply
// itself are the frontend's, reached through fe (httpBackend) and the
// in-process compatibility servers, so the HTTP and gRPC APIs give the
// same predictions.
//
// Invariants:
//   - Every field is set once by newHTTPAPI, in New, and only read after:
//     the handlers share one httpAPI across goroutines without a lock.
//     services and svcOrder are the frontend's own (fixed once New
//     returns), not copies.
//   - A request body is admitted (admit, limits.max_inflight_bytes) on
//     its size, at most maxBytes, before it is read, and read through
//     http.MaxBytesReader(maxBytes); decoded tensors take at most
//     maxDecoded bytes. A REST body's admission is given back once it is
//     decoded, before the compatibility method admits the decoded request
//     as any gRPC request; the JSON API's admission is held through
//     predictAdmitted.
//   - With client authentication (auth non-nil) every client endpoint
//     authenticates the request and authorizes the model it names before
//     its handler runs; health (/healthz, /v2/health/*) and /metrics stay
//     open.
type httpAPI struct {
	fe httpBackend
	// The compatibility servers the REST dialects are answered by, called
	// in process (inProcess).
	tfPredict tfapis.PredictionServiceServer
	tfModel   tfapis.ModelServiceServer
	kserve    inference.GRPCInferenceServiceServer

	log      *slog.Logger
	m        *metrics
	registry *prometheus.Registry // served on /metrics
	// auth is the client authentication (nil: open client ports).
	auth  clientGate
	admit *admission
	// maxBytes is limits.max_message_bytes, maxDecoded
	// limits.max_decoded_bytes.
	maxBytes   int
	maxDecoded int
	// services and svcOrder are the frontend's services, by name and in
	// configuration order (GET /v1/services, the service label of a
	// refused request).
	services map[string]*serviceInfo
	svcOrder []string
}

// httpBackend is what the HTTP API asks of the frontend.
type httpBackend interface {
	// predictAdmitted serves a predict request (admitted: its body's
	// admission is held by the caller).
	predictAdmitted(ctx context.Context, req *hamsv1.PredictRequest, admitted bool) (*hamsv1.PredictResponse, error)
	// unresolved lists the entry models without a live instance.
	unresolved() []string
	// modelService is the service serving model name (NotFound if none).
	modelService(name string) (*serviceInfo, error)
	// passFor is the pass-through model name calls (nil if none).
	passFor(name string) *passThrough
	// authorize refuses p a model it may not call.
	authorize(p *principal, name string) error
	// httpAuth wraps a JSON API endpoint in client authentication
	// (clientauth.go).
	httpAuth(h http.HandlerFunc, model func(*http.Request) (string, bool)) http.HandlerFunc
}

var _ httpBackend = (*Frontend)(nil)

// newHTTPAPI is f's HTTP API. It reads f's limits, metrics, logger,
// client authentication and services once: New calls it after setting
// them all.
func newHTTPAPI(f *Frontend) *httpAPI {
	return &httpAPI{
		fe:         f,
		tfPredict:  &tfPredictServer{f: f},
		tfModel:    &tfModelServer{f: f},
		kserve:     &kserveServer{f: f},
		log:        f.log,
		m:          f.m,
		registry:   f.cfg.Registry,
		auth:       f.auth,
		admit:      f.admit,
		maxBytes:   f.maxBytes,
		maxDecoded: f.maxDecoded,
		services:   f.services,
		svcOrder:   f.svcOrder,
	}
}
