// Package config loads and validates the YAML file that describes a
// deployment: models (backend, stateful or not, batching, fan-in), services
// (edges of a DAG whose source and sink is the frontend) and hosts for
// placement. Load validates everything and does no other I/O; errors name
// the model, service or edge at fault.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Frontend is the reserved node name of the frontend in edges: edges from
// it are the service's entries, edges to it are its sinks.
const Frontend = "frontend"

// ErrInvalid is wrapped by every validation error.
var ErrInvalid = errors.New("config: invalid")

// Modes of fault tolerance (docs/design.md).
var Modes = []string{"bare", "nspb", "remus", "nspb-s1", "nspb-s2", "replay"}

// Backend types a sidecar can drive.
var BackendTypes = []string{"reference", "tfserving", "triton", "clipper"}

// FanIn says how a model with several predecessors combines their items.
const (
	// FanInJoin waits for one item per predecessor of the same request and
	// executes them as one request (the branches of one request meet).
	FanInJoin = "join"
	// FanInInterleave executes every arriving item as its own request
	// (independent streams merge).
	FanInInterleave = "interleave"
)

// Duration is a time.Duration that reads "2ms" style strings from YAML.
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: duration: %w", n.Line, err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: duration %q: %w", n.Line, s, err)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Deployment is the whole file.
type Deployment struct {
	// Name of the deployment (JetStream subjects and KV keys use it).
	Name string `yaml:"name"`
	// Mode is the fault-tolerance mode; default "nspb".
	Mode string `yaml:"mode"`
	// Hosts lists placement targets; on the embedded default they are
	// labels of processes on one machine.
	Hosts    []string  `yaml:"hosts"`
	Models   []Model   `yaml:"models"`
	Services []Service `yaml:"services"`
	// Limits applied at the edge.
	Limits Limits `yaml:"limits"`
	// Replay configures mode "replay" (replay.go).
	Replay Replay `yaml:"replay"`
	// ClientAuth authenticates the frontend's clients (clientauth.go);
	// nil: open client ports.
	ClientAuth *ClientAuth `yaml:"client_auth,omitempty"`
}

// Limits bounds what the frontend and sidecars accept.
type Limits struct {
	// MaxMessageBytes is the gRPC message size limit on every server and
	// client of the deployment (default 64 MiB; grpc-go's own is 4 MiB).
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// RequestTimeout is the default client deadline (default 10s).
	RequestTimeout Duration `yaml:"request_timeout"`
	// MaxRowsPerRequest caps dimension 0 (the rows) of every input tensor
	// of one client request (default DefaultMaxRowsPerRequest); a request
	// over it is refused with InvalidArgument naming the tensor. The
	// request's bytes are capped by MaxMessageBytes, which also bounds
	// what the frontend decodes from any API (MaxDecodedBytes).
	MaxRowsPerRequest int `yaml:"max_rows_per_request,omitempty"`
	// MaxInflightRequests and MaxInflightBytes bound the client requests
	// a frontend works on at once and their tensor bytes (defaults
	// DefaultMaxInflightRequests and DefaultInflightMessages times
	// max_message_bytes); a request beyond either is answered
	// ResourceExhausted at once instead of queueing behind the others.
	// The byte bound is never below max_message_bytes (one request of the
	// largest size always fits when nothing else is in flight).
	MaxInflightRequests int   `yaml:"max_inflight_requests,omitempty"`
	MaxInflightBytes    int64 `yaml:"max_inflight_bytes,omitempty"`
	// RejectNonFinite makes the frontend refuse requests whose
	// floating-point inputs hold NaN or ±Inf (InvalidArgument naming the
	// tensor and element). Unset: on for every service that contains a
	// stateful model (one poisoned request would otherwise poison the
	// state every later request reads), off for the others. A model's own
	// reject_non_finite overrides it for the services that contain it.
	RejectNonFinite *bool `yaml:"reject_non_finite,omitempty"`
}

// Defaults of Limits.
const (
	DefaultMaxRowsPerRequest   = 4096
	DefaultMaxInflightRequests = 4096
	// DefaultInflightMessages is max_inflight_bytes' default in units of
	// max_message_bytes.
	DefaultInflightMessages = 4
)

// MaxDecodedBytes is the most tensor data the frontend builds from one
// request on any API (JSON numbers, TF Serving's typed and broadcast
// fields, KServe's contents): the message limit, checked before the
// tensors are allocated.
func (l Limits) MaxDecodedBytes() int { return l.MaxMessageBytes }

// Model is one model of the graph.
type Model struct {
	Name string `yaml:"name"`
	// Kind is the reference model server's model kind (classifier, lstm,
	// olearn, knn, arima, astar, transcriber, concat, cnn, prep); for other
	// backends it is informational.
	Kind     string         `yaml:"kind"`
	Backend  Backend        `yaml:"backend"`
	Stateful bool           `yaml:"stateful"`
	HA       string         `yaml:"ha"`
	Batch    Batch          `yaml:"batch"`
	FanIn    string         `yaml:"fan_in"`
	Params   map[string]any `yaml:"params"`
	// Placement names hosts; a stateful model needs a backup on another
	// host than its primary.
	Placement Placement `yaml:"placement"`
	// Replicas makes a stateless model a replica pool (pool.go): several
	// instances of the same model behind one sidecar, one queue.
	Replicas Instances `yaml:"replicas,omitempty"`
	// Redundancy of the pool: none (default without parity), er, hedge,
	// parm (default with parity).
	Redundancy Redundancy `yaml:"redundancy,omitempty"`
	// Parity configures coding groups and parity models (parm), and the
	// number of extra copies (er, hedge).
	Parity *Parity `yaml:"parity,omitempty"`
	// HedgeAfter is hedge's re-send delay (default: the pool's observed
	// p95 service time).
	HedgeAfter Duration `yaml:"hedge_after,omitempty"`
	// Straggle slows replicas the deployment starts (fault injection).
	Straggle *Straggle `yaml:"straggle,omitempty"`
	// RejectNonFinite overrides limits.reject_non_finite for the services
	// that contain this model (Deployment.RejectNonFinite).
	RejectNonFinite *bool `yaml:"reject_non_finite,omitempty"`
}

// Backend says how the sidecar reaches the model server.
type Backend struct {
	// Type is one of BackendTypes; default "reference".
	Type string `yaml:"type"`
	// Address is host:port of an already running model server (for
	// clipper: of its query frontend). Empty means the deployment starts a
	// server per instance that speaks the backend's API and runs the
	// model's kind: the reference model server for reference, tfserving and
	// triton (it serves ModelRuntime, TF Serving and KServe v2 on one port),
	// a Clipper query-frontend stand-in for clipper.
	Address string `yaml:"address"`
	// Model is the name of the model at the backend (default: Model.Name).
	Model string `yaml:"model"`
	// Version or label at the backend (TF Serving / Triton), optional.
	Version string `yaml:"version"`
	// Signature is the TF Serving signature name, optional.
	Signature string `yaml:"signature"`
	// Timeout of one backend call (default 5s).
	Timeout Duration `yaml:"timeout"`
	// StateMemory is where the triton adapter of a stateful model keeps
	// its double-buffered state: "system" (POSIX shared memory; "" means
	// it) or "cuda" (device memory of the sidecar's process, registered
	// with CudaSharedMemoryRegister; needs a CUDA driver and a GPU on the
	// host, docs/triton.md).
	StateMemory string `yaml:"state_memory"`
	// CUDADevice is the device ordinal of state_memory cuda (default 0).
	CUDADevice int `yaml:"cuda_device"`
	// TypedInputs makes the tfserving and triton adapters send inputs in
	// the typed value fields (TensorProto *_val, KServe
	// InferTensorContents) instead of tensor_content /
	// raw_input_contents, for servers or proxies that take only those.
	TypedInputs bool `yaml:"typed_inputs"`
	// Clipper names a clipper application's tensors (type clipper only).
	Clipper ClipperTensors `yaml:"clipper"`
}

// ClipperTensors describes what a Clipper application takes and answers:
// Clipper's REST API has no names or datatypes of its own.
type ClipperTensors struct {
	// Input names the one input tensor (default "input").
	Input string `yaml:"input"`
	// InputDatatype is declared to the sidecar (default: none, any
	// numeric or BYTES tensor is accepted).
	InputDatatype string `yaml:"input_datatype"`
	// Output names the output tensor (default "output").
	Output string `yaml:"output"`
	// OutputDatatype: FP32 (default), FP64, INT32, INT64 or BYTES.
	OutputDatatype string `yaml:"output_datatype"`
	// HealthProbe is one input row that health checks predict (after
	// GET /metrics); an answer with the app's default output is
	// unhealthy. Numbers, sent as input_datatype (FP32 when unset).
	HealthProbe []float64 `yaml:"health_probe"`
}

// ClipperOutputDatatypes lists the values of ClipperTensors.OutputDatatype.
var ClipperOutputDatatypes = []string{"FP32", "FP64", "INT32", "INT64", "BYTES"}

// clipperProbeDatatypes are the input datatypes a health probe's numbers
// can be sent as.
var clipperProbeDatatypes = []string{"", "FP32", "FP64", "INT32", "INT64"}

func (b *Backend) validateClipper(where string) []error {
	c := b.Clipper
	if b.Type != "clipper" {
		if b.TypedInputs && b.Type == "reference" {
			return []error{invalid("%s: backend.typed_inputs is for backend types tfserving and triton", where)}
		}
		if c.Input != "" || c.InputDatatype != "" || c.Output != "" || c.OutputDatatype != "" || len(c.HealthProbe) > 0 {
			return []error{invalid("%s: backend.clipper is for backend type clipper, not %s", where, b.Type)}
		}
		return nil
	}
	var errs []error
	if b.TypedInputs {
		errs = append(errs, invalid("%s: backend.typed_inputs is for backend types tfserving and triton (Clipper takes JSON)", where))
	}
	if c.OutputDatatype != "" && !oneOf(c.OutputDatatype, ClipperOutputDatatypes) {
		errs = append(errs, invalid("%s: backend.clipper.output_datatype %q is not one of %s", where, c.OutputDatatype, strings.Join(ClipperOutputDatatypes, ", ")))
	}
	if len(c.HealthProbe) > 0 && !oneOf(c.InputDatatype, clipperProbeDatatypes) {
		errs = append(errs, invalid("%s: backend.clipper.health_probe needs a numeric input_datatype (FP32, FP64, INT32, INT64), not %q", where, c.InputDatatype))
	}
	return errs
}

// StateMemories lists the values of Backend.StateMemory.
var StateMemories = []string{"system", "cuda"}

// Batch configures the sidecar's batching.
type Batch struct {
	// Size is the maximum number of requests in a batch (default 1).
	Size int `yaml:"size"`
	// MaxWait is how long a partial batch waits for more requests (default
	// 0: execute what is there as soon as the backend is free).
	MaxWait Duration `yaml:"max_wait"`
}

// Placement of a model's instances.
type Placement struct {
	Primary string `yaml:"primary"`
	Backup  string `yaml:"backup"`
	Standby string `yaml:"standby"`
}

// Service is one DAG of models.
type Service struct {
	Name string `yaml:"name"`
	// Edges are [from, to] pairs; "frontend" is the source and the sink.
	Edges [][2]string `yaml:"edges"`
	// Inputs the client sends (documentation and request validation).
	Inputs []TensorSpec `yaml:"inputs"`
	// Outputs the client gets back, as the compatibility APIs name them
	// (tensor names; "<sink model>/<tensor>" for several sinks): what
	// TF Serving's GetModelMetadata and KServe's ModelMetadata answer
	// (documentation only: replies are not checked against them).
	Outputs []TensorSpec `yaml:"outputs"`
}

// TensorSpec describes a client input.
type TensorSpec struct {
	Name     string  `yaml:"name"`
	Datatype string  `yaml:"datatype"`
	Shape    []int64 `yaml:"shape"`
}

// Load reads and validates a deployment file.
func Load(path string) (*Deployment, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	d, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// Parse decodes YAML (unknown fields are errors), applies defaults and
// validates.
func Parse(b []byte) (*Deployment, error) {
	var d Deployment
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("%w: yaml: %v", ErrInvalid, err)
	}
	d.applyDefaults()
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return &d, nil
}

func (d *Deployment) applyDefaults() {
	if d.Name == "" {
		d.Name = "hams"
	}
	if d.Mode == "" {
		d.Mode = "nspb"
	}
	if d.Limits.MaxMessageBytes == 0 {
		d.Limits.MaxMessageBytes = 64 << 20
	}
	if d.Limits.RequestTimeout == 0 {
		d.Limits.RequestTimeout = Duration(10 * time.Second)
	}
	if d.Limits.MaxRowsPerRequest == 0 {
		d.Limits.MaxRowsPerRequest = DefaultMaxRowsPerRequest
	}
	if d.Limits.MaxInflightRequests == 0 {
		d.Limits.MaxInflightRequests = DefaultMaxInflightRequests
	}
	if d.Limits.MaxInflightBytes == 0 && d.Limits.MaxMessageBytes > 0 {
		d.Limits.MaxInflightBytes = DefaultInflightMessages * int64(d.Limits.MaxMessageBytes)
	}
	d.Replay.applyDefaults()
	for i := range d.Models {
		m := &d.Models[i]
		if m.Backend.Type == "" {
			m.Backend.Type = "reference"
		}
		if m.Backend.Model == "" {
			m.Backend.Model = m.Name
		}
		if m.Backend.Timeout == 0 {
			m.Backend.Timeout = Duration(5 * time.Second)
		}
		if m.Batch.Size == 0 {
			m.Batch.Size = 1
		}
		if m.FanIn == "" {
			m.FanIn = FanInJoin
		}
		m.applyPoolDefaults()
		if m.HA == "" {
			if m.Stateful {
				m.HA = "stateful"
			} else {
				m.HA = "stateless"
			}
		}
	}
	d.addImplicitServices()
}

// addImplicitServices gives every model that no service's edges name a
// one-model service of its own name, [[frontend, m], [m, frontend]], so a
// model is served by its one line under models: (retrofit). A model whose
// name a service already takes gets none; Validate reports it.
func (d *Deployment) addImplicitServices() {
	named := map[string]bool{}
	for _, s := range d.Services {
		named[s.Name] = true
		for _, e := range s.Edges {
			named[e[0]], named[e[1]] = true, true
		}
	}
	for _, m := range d.Models {
		if m.Name == "" || named[m.Name] {
			continue
		}
		named[m.Name] = true
		d.Services = append(d.Services, Service{Name: m.Name, Edges: [][2]string{{Frontend, m.Name}, {m.Name, Frontend}}})
	}
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, a...)...)
}

func oneOf(v string, set []string) bool {
	for _, s := range set {
		if s == v {
			return true
		}
	}
	return false
}

// Validate checks the whole deployment: names, modes, batching, placement,
// edges (unknown names, duplicates, cycles, reachability).
func (d *Deployment) Validate() error {
	var errs []error
	if !oneOf(d.Mode, Modes) {
		errs = append(errs, invalid("mode %q is not one of %s", d.Mode, strings.Join(Modes, ", ")))
	}
	if d.Limits.MaxMessageBytes < 0 {
		errs = append(errs, invalid("limits.max_message_bytes must be positive"))
	}
	if d.Limits.RequestTimeout < 0 {
		errs = append(errs, invalid("limits.request_timeout %s is negative", d.Limits.RequestTimeout.D()))
	}
	if d.Limits.MaxRowsPerRequest < 0 {
		errs = append(errs, invalid("limits.max_rows_per_request %d is negative", d.Limits.MaxRowsPerRequest))
	}
	if d.Limits.MaxInflightRequests < 0 {
		errs = append(errs, invalid("limits.max_inflight_requests %d is negative", d.Limits.MaxInflightRequests))
	}
	if d.Limits.MaxInflightBytes < 0 {
		errs = append(errs, invalid("limits.max_inflight_bytes %d is negative", d.Limits.MaxInflightBytes))
	}
	errs = append(errs, d.Replay.validate()...)
	errs = append(errs, d.ClientAuth.validate(d)...)
	hosts := map[string]bool{}
	for _, h := range d.Hosts {
		if hosts[h] {
			errs = append(errs, invalid("host %q listed twice", h))
		}
		hosts[h] = true
	}
	if len(d.Models) == 0 {
		errs = append(errs, invalid("no models"))
	}
	models := map[string]*Model{}
	for i := range d.Models {
		m := &d.Models[i]
		where := fmt.Sprintf("model %d", i)
		if m.Name != "" {
			where = fmt.Sprintf("model %q", m.Name)
		}
		switch {
		case m.Name == "":
			errs = append(errs, invalid("%s: missing name", where))
		case m.Name == Frontend:
			errs = append(errs, invalid("%s: the name %q is reserved", where, Frontend))
		case strings.ContainsAny(m.Name, " .*>/\t"):
			errs = append(errs, invalid("%s: name may not contain spaces, '.', '*', '>' or '/'", where))
		case models[m.Name] != nil:
			errs = append(errs, invalid("%s: defined twice", where))
		default:
			models[m.Name] = m
		}
		if m.Kind == "" && m.Backend.Type == "reference" {
			errs = append(errs, invalid("%s: missing kind (the reference model server needs it)", where))
		}
		if !oneOf(m.Backend.Type, BackendTypes) {
			errs = append(errs, invalid("%s: backend type %q is not one of %s", where, m.Backend.Type, strings.Join(BackendTypes, ", ")))
		}
		if m.Backend.Type != "reference" && m.Backend.Address == "" && m.Kind == "" {
			errs = append(errs, invalid("%s: backend type %s needs an address (a running server), or a kind for the deployment to start a server speaking that API", where, m.Backend.Type))
		}
		errs = append(errs, m.Backend.validateStateMemory(where, m.Stateful)...)
		errs = append(errs, m.Backend.validateClipper(where)...)
		if !oneOf(m.HA, []string{"off", "stateless", "stateful"}) {
			errs = append(errs, invalid("%s: ha %q is not one of off, stateless, stateful", where, m.HA))
		}
		if m.HA == "stateful" && !m.Stateful {
			errs = append(errs, invalid("%s: ha stateful on a model not marked stateful", where))
		}
		if m.Batch.Size < 1 || m.Batch.Size > 4096 {
			errs = append(errs, invalid("%s: batch size %d out of range 1..4096", where, m.Batch.Size))
		}
		if m.Batch.MaxWait < 0 {
			errs = append(errs, invalid("%s: negative batch max_wait", where))
		}
		if m.FanIn != FanInJoin && m.FanIn != FanInInterleave {
			errs = append(errs, invalid("%s: fan_in %q is not join or interleave", where, m.FanIn))
		}
		for _, h := range []string{m.Placement.Primary, m.Placement.Backup, m.Placement.Standby} {
			if h != "" && len(hosts) > 0 && !hosts[h] {
				errs = append(errs, invalid("%s: placement names unknown host %q", where, h))
			}
		}
		errs = append(errs, m.validatePool(where, d.entryInputs(m.Name))...)
		if m.Stateful && m.HA == "stateful" {
			if m.Placement.Backup == "" {
				errs = append(errs, invalid("%s: stateful model without a backup placement", where))
			} else if m.Placement.Backup == m.Placement.Primary {
				errs = append(errs, invalid("%s: backup placed on its primary's host %q", where, m.Placement.Backup))
			}
		}
	}
	owner := map[string]string{}
	seenSvc := map[string]bool{}
	if len(d.Services) == 0 {
		errs = append(errs, invalid("no services"))
	}
	for i := range d.Services {
		s := &d.Services[i]
		if s.Name == "" {
			errs = append(errs, invalid("service %d: missing name", i))
			continue
		}
		if seenSvc[s.Name] {
			errs = append(errs, invalid("service %q: defined twice", s.Name))
		}
		seenSvc[s.Name] = true
		errs = append(errs, d.validateService(s, models, owner)...)
	}
	for _, m := range d.Models {
		if _, ok := owner[m.Name]; !ok && m.Name != "" && seenSvc[m.Name] {
			errs = append(errs, invalid("model %q is in no service, and the one-model service it would get is taken: service %q does not include it (name it in that service's edges or rename one of them)", m.Name, m.Name))
		}
	}
	return errors.Join(errs...)
}

func (d *Deployment) validateService(s *Service, models map[string]*Model, owner map[string]string) []error {
	var errs []error
	where := fmt.Sprintf("service %q", s.Name)
	if len(s.Edges) == 0 {
		return []error{invalid("%s: no edges", where)}
	}
	seen := map[[2]string]bool{}
	nodes := map[string]bool{}
	for _, e := range s.Edges {
		for _, n := range e {
			if n == "" {
				errs = append(errs, invalid("%s: edge %v has an empty end", where, e))
				continue
			}
			if n != Frontend && models[n] == nil {
				errs = append(errs, invalid("%s: edge %s -> %s names unknown model %q", where, e[0], e[1], n))
				continue
			}
			nodes[n] = true
		}
		if e[0] == e[1] {
			errs = append(errs, invalid("%s: edge %s -> %s is a self-loop", where, e[0], e[1]))
		}
		if e[0] == Frontend && e[1] == Frontend {
			errs = append(errs, invalid("%s: edge frontend -> frontend", where))
		}
		if seen[e] {
			errs = append(errs, invalid("%s: edge %s -> %s listed twice", where, e[0], e[1]))
		}
		seen[e] = true
	}
	if len(errs) > 0 {
		return errs
	}
	for n := range nodes {
		if n == Frontend {
			continue
		}
		if o, ok := owner[n]; ok && o != s.Name {
			errs = append(errs, invalid("%s: model %q already belongs to service %q (a model serves one service)", where, n, o))
		}
		owner[n] = s.Name
	}
	g := graphOf(s)
	if len(g.Succ(Frontend)) == 0 {
		errs = append(errs, invalid("%s: no edge leaves the frontend", where))
	}
	if len(g.Pred(Frontend)) == 0 {
		errs = append(errs, invalid("%s: no edge reaches the frontend", where))
	}
	if cyc := g.cycle(); cyc != nil {
		errs = append(errs, invalid("%s: cycle %s", where, strings.Join(cyc, " -> ")))
	}
	for n := range nodes {
		if n == Frontend {
			continue
		}
		if len(g.Pred(n)) == 0 {
			errs = append(errs, invalid("%s: model %q has no incoming edge", where, n))
		}
		if len(g.Succ(n)) == 0 {
			errs = append(errs, invalid("%s: model %q has no outgoing edge (route it to the frontend)", where, n))
		}
	}
	return errs
}

// entryInputs are the declared client inputs of the service whose entry
// model is name (none when name is not fed by the frontend alone).
func (d *Deployment) entryInputs(name string) []TensorSpec {
	for i := range d.Services {
		s := &d.Services[i]
		pred := graphOf(s).Pred(name)
		if len(pred) == 1 && pred[0] == Frontend {
			return s.Inputs
		}
	}
	return nil
}

// Model returns the named model or nil.
func (d *Deployment) Model(name string) *Model {
	for i := range d.Models {
		if d.Models[i].Name == name {
			return &d.Models[i]
		}
	}
	return nil
}

// Service returns the named service or nil.
func (d *Deployment) Service(name string) *Service {
	for i := range d.Services {
		if d.Services[i].Name == name {
			return &d.Services[i]
		}
	}
	return nil
}

// ServiceOf returns the service a model belongs to, or nil.
func (d *Deployment) ServiceOf(model string) *Service {
	for i := range d.Services {
		for _, e := range d.Services[i].Edges {
			if e[0] == model || e[1] == model {
				return &d.Services[i]
			}
		}
	}
	return nil
}

// ServiceNames lists the services in file order.
func (d *Deployment) ServiceNames() []string {
	out := make([]string, len(d.Services))
	for i, s := range d.Services {
		out[i] = s.Name
	}
	return out
}

// Graph is a service's DAG with the frontend as source and sink.
type Graph struct {
	succ map[string][]string
	pred map[string][]string
	// order of first appearance, for deterministic iteration
	nodes []string
}

// Graph returns the service's DAG.
func (s *Service) Graph() *Graph { return graphOf(s) }

func graphOf(s *Service) *Graph {
	g := &Graph{succ: map[string][]string{}, pred: map[string][]string{}}
	seen := map[string]bool{}
	for _, e := range s.Edges {
		for _, n := range e {
			if !seen[n] {
				seen[n] = true
				g.nodes = append(g.nodes, n)
			}
		}
		g.succ[e[0]] = append(g.succ[e[0]], e[1])
		g.pred[e[1]] = append(g.pred[e[1]], e[0])
	}
	return g
}

// Succ lists the successors of n in edge order.
func (g *Graph) Succ(n string) []string { return g.succ[n] }

// Pred lists the predecessors of n in edge order.
func (g *Graph) Pred(n string) []string { return g.pred[n] }

// Models lists the models (not the frontend) in topological order, ties
// broken by first appearance in the edge list.
func (g *Graph) Models() []string {
	indeg := map[string]int{}
	for _, n := range g.nodes {
		if n == Frontend {
			continue
		}
		for _, p := range g.pred[n] {
			if p != Frontend {
				indeg[n]++
			}
		}
	}
	var out []string
	done := map[string]bool{}
	for len(out) < len(g.nodes)-1 {
		progressed := false
		for _, n := range g.nodes {
			if n == Frontend || done[n] || indeg[n] > 0 {
				continue
			}
			done[n] = true
			out = append(out, n)
			progressed = true
			for _, s := range g.succ[n] {
				if s != Frontend {
					indeg[s]--
				}
			}
		}
		if !progressed {
			break // cycle; Validate reports it
		}
	}
	return out
}

// Entries lists the models fed by the frontend.
func (g *Graph) Entries() []string { return g.succ[Frontend] }

// Sinks lists the models that feed the frontend, sorted by name.
func (g *Graph) Sinks() []string {
	s := append([]string(nil), g.pred[Frontend]...)
	sort.Strings(s)
	return s
}

// Hops is the number of models on the longest frontend-to-frontend path.
func (g *Graph) Hops() int {
	depth := map[string]int{}
	best := 0
	for _, n := range g.Models() {
		d := 0
		for _, p := range g.pred[n] {
			if p != Frontend && depth[p] > d {
				d = depth[p]
			}
		}
		depth[n] = d + 1
		if depth[n] > best {
			best = depth[n]
		}
	}
	return best
}

// cycle returns one cycle among models, or nil. Edges into the frontend end
// paths; edges out of it start them, so the frontend itself never closes a
// cycle.
func (g *Graph) cycle() []string {
	const (
		white = 0
		grey  = 1
		black = 2
	)
	color := map[string]int{}
	var stack []string
	var found []string
	var visit func(n string) bool
	visit = func(n string) bool {
		color[n] = grey
		stack = append(stack, n)
		for _, s := range g.succ[n] {
			if s == Frontend {
				continue
			}
			switch color[s] {
			case grey:
				for i, x := range stack {
					if x == s {
						found = append(append([]string(nil), stack[i:]...), s)
						return true
					}
				}
			case white:
				if visit(s) {
					return true
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[n] = black
		return false
	}
	for _, n := range g.nodes {
		if n != Frontend && color[n] == white && visit(n) {
			return found
		}
	}
	return nil
}

// StatefulModels returns the names of the models replicated as primary +
// backup (stateful with ha: stateful).
func (d *Deployment) StatefulModels() []string {
	var out []string
	for _, m := range d.Models {
		if m.Stateful && m.HA == "stateful" {
			out = append(out, m.Name)
		}
	}
	return out
}

// RejectNonFinite reports whether the frontend refuses NaN and ±Inf in
// the inputs of service svc: a model of the service with
// reject_non_finite set decides (true if any of them says true), else
// limits.reject_non_finite when set, else whether the service contains a
// stateful model.
func (d *Deployment) RejectNonFinite(svc string) bool {
	s := d.Service(svc)
	if s == nil {
		return false
	}
	var set, on, stateful bool
	for _, name := range s.Graph().Models() {
		m := d.Model(name)
		if m == nil {
			continue
		}
		stateful = stateful || m.Stateful
		if m.RejectNonFinite != nil {
			set = true
			on = on || *m.RejectNonFinite
		}
	}
	switch {
	case set:
		return on
	case d.Limits.RejectNonFinite != nil:
		return *d.Limits.RejectNonFinite
	}
	return stateful
}

// ParamInt reads an integer model parameter with a default.
func (m *Model) ParamInt(key string, def int) (int, error) {
	v, ok := m.Params[key]
	if !ok {
		return def, nil
	}
	switch x := v.(type) {
	case int:
		return x, nil
	case int64:
		return int(x), nil
	case float64:
		if x == float64(int(x)) {
			return int(x), nil
		}
	}
	return 0, invalid("model %q: param %s: want an integer, got %v", m.Name, key, v)
}

// ParamFloat reads a float model parameter with a default.
func (m *Model) ParamFloat(key string, def float64) (float64, error) {
	v, ok := m.Params[key]
	if !ok {
		return def, nil
	}
	switch x := v.(type) {
	case int:
		return float64(x), nil
	case float64:
		return x, nil
	}
	return 0, invalid("model %q: param %s: want a number, got %v", m.Name, key, v)
}

// ParamString reads a string model parameter with a default.
func (m *Model) ParamString(key, def string) (string, error) {
	v, ok := m.Params[key]
	if !ok {
		return def, nil
	}
	if s, ok := v.(string); ok {
		return s, nil
	}
	return "", invalid("model %q: param %s: want a string, got %v", m.Name, key, v)
}

// PassThroughAPIs lists the client APIs of the frontend through which a
// backend type can be served pass-through: the gRPC APIs the backend
// itself speaks (the reference model server speaks both).
var PassThroughAPIs = map[string][]string{
	"tfserving": {"tfserving"},
	"triton":    {"kserve"},
	"reference": {"tfserving", "kserve"},
}

// PassThrough reports whether model name is served pass-through in
// retrofit mode: ha: off, not stateful, the only model of its service,
// and a backend whose own gRPC API the frontend serves (PassThroughAPIs;
// not clipper, whose REST API it does not). Such a model has no sidecar:
// the frontend's TF Serving and KServe v2 endpoints forward calls for it
// to its backend unchanged. Every other ha: off model runs through a
// sidecar without a standby.
func (d *Deployment) PassThrough(name string) bool {
	m := d.Model(name)
	if m == nil || m.HA != "off" || m.Stateful || PassThroughAPIs[m.Backend.Type] == nil {
		return false
	}
	s := d.ServiceOf(name)
	return s != nil && len(s.Graph().Models()) == 1
}

// HasStandby reports whether model name gets a hot standby in a
// fault-tolerant mode: stateless, ha: stateless, and not pass-through.
// (Replicated stateful models get a backup instead; ha: off models get
// no spare: the manager's recovery starts a fresh instance of a stateless
// one when it fails.)
func (d *Deployment) HasStandby(name string) bool {
	m := d.Model(name)
	return m != nil && !m.Stateful && m.HA == "stateless" && !d.PassThrough(name)
}

// validateStateMemory checks state_memory and cuda_device: cuda only for a
// stateful model behind the triton adapter, a device only with cuda.
func (b *Backend) validateStateMemory(where string, stateful bool) []error {
	var errs []error
	switch b.StateMemory {
	case "", "system":
	case "cuda":
		if b.Type != "triton" {
			errs = append(errs, invalid("%s: backend state_memory cuda needs backend type triton (got %s)", where, b.Type))
		}
		if !stateful {
			errs = append(errs, invalid("%s: backend state_memory cuda is for a stateful model (the adapter's state buffers)", where))
		}
	default:
		errs = append(errs, invalid("%s: backend state_memory %q is not one of %s", where, b.StateMemory, strings.Join(StateMemories, ", ")))
	}
	if b.CUDADevice < 0 {
		errs = append(errs, invalid("%s: backend cuda_device %d is negative", where, b.CUDADevice))
	} else if b.CUDADevice != 0 && b.StateMemory != "cuda" {
		errs = append(errs, invalid("%s: backend cuda_device %d without state_memory: cuda", where, b.CUDADevice))
	}
	return errs
}
