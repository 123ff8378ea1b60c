package frontend

import (
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// serviceInfo is what the frontend needs of one service, computed once
// from the deployment.
type serviceInfo struct {
	name    string
	entries []string // models fed by the frontend, in edge order
	sinks   []string // models feeding the frontend, sorted by name
	models  []string // topological order
	inputs  []config.TensorSpec
	outputs []config.TensorSpec
	graph   *config.Graph
	// version and label are what the compatibility APIs serve: the one
	// version of the service (backend.version of a one-model service's
	// model when it is a number, else 1) and its label (backend.version
	// when it is not a number, else none). Any other version or label is
	// NotFound.
	version int64
	label   string
	// signature is backend.signature of a one-model service's model: a
	// TF Serving signature key the service answers to besides
	// serving_default.
	signature string
	// rejectNonFinite: NaN and ±Inf inputs are refused
	// (config.Deployment.RejectNonFinite).
	rejectNonFinite bool
}

func newServiceInfo(d *config.Deployment, s *config.Service) *serviceInfo {
	g := s.Graph()
	info := &serviceInfo{
		graph:   g,
		name:    s.Name,
		entries: append([]string(nil), g.Entries()...),
		sinks:   g.Sinks(),
		models:  g.Models(),
		inputs:  s.Inputs,
		outputs: s.Outputs,
		version: compatVersion,

		rejectNonFinite: d.RejectNonFinite(s.Name),
	}
	if len(info.models) == 1 {
		if m := d.Model(info.models[0]); m != nil {
			info.signature = m.Backend.Signature
		}
		if m := d.Model(info.models[0]); m != nil && m.Backend.Version != "" {
			if v, err := strconv.ParseInt(m.Backend.Version, 10, 64); err == nil && v > 0 {
				info.version = v
			} else {
				info.label = m.Backend.Version
			}
		}
	}
	return info
}

// proto describes the service for ListServices.
func (s *serviceInfo) proto() *hamsv1.ServiceInfo {
	out := &hamsv1.ServiceInfo{
		Name:        s.name,
		EntryModels: append([]string(nil), s.entries...),
		SinkModels:  append([]string(nil), s.sinks...),
		Models:      append([]string(nil), s.models...),
	}
	for _, in := range s.inputs {
		out.Inputs = append(out.Inputs, &hamsv1.TensorSpec{Name: in.Name, Datatype: in.Datatype, Shape: append([]int64(nil), in.Shape...)})
	}
	return out
}

// validateInputs checks a request's tensors against the service's declared
// inputs (when it declares any): every declared input present once, no
// undeclared input, datatype equal, rank equal and every dimension equal
// unless declared -1; every tensor well-formed (tensor.Validate); and the
// tensors' data at most maxBytes in total. Errors are gRPC statuses that
// name the culprit tensor: InvalidArgument, or ResourceExhausted for size.
func (s *serviceInfo) validateInputs(inputs []*hamsv1.Tensor, maxBytes int) error {
	if len(inputs) == 0 {
		return status.Errorf(codes.InvalidArgument, "service %q: request has no input tensors", s.name)
	}
	seen := make(map[string]bool, len(inputs))
	total := 0
	for i, t := range inputs {
		if t == nil {
			return status.Errorf(codes.InvalidArgument, "service %q: input %d is empty", s.name, i)
		}
		if t.GetName() == "" {
			return status.Errorf(codes.InvalidArgument, "service %q: input %d has no name", s.name, i)
		}
		if seen[t.GetName()] {
			return status.Errorf(codes.InvalidArgument, "service %q: input %q given twice", s.name, t.GetName())
		}
		seen[t.GetName()] = true
		total += len(t.GetData())
		if maxBytes > 0 && total > maxBytes {
			return status.Errorf(codes.ResourceExhausted, "service %q: input %q: request tensors exceed %d bytes", s.name, t.GetName(), maxBytes)
		}
		if len(s.inputs) > 0 {
			if err := s.declared(t.GetName()); err != nil {
				return err
			}
			spec := s.spec(t.GetName())
			if err := checkSpec(spec, t); err != nil {
				return status.Errorf(codes.InvalidArgument, "service %q: input %q: %v", s.name, t.GetName(), err)
			}
		}
		if err := tensor.Validate(t); err != nil {
			return status.Errorf(codes.InvalidArgument, "service %q: input %q: %v", s.name, t.GetName(), err)
		}
	}
	for _, in := range s.inputs {
		if !seen[in.Name] {
			return status.Errorf(codes.InvalidArgument, "service %q: missing input %q (%s %v)", s.name, in.Name, in.Datatype, in.Shape)
		}
	}
	return nil
}

// declared is nil when the service declares no inputs or declares name,
// else InvalidArgument naming it.
func (s *serviceInfo) declared(name string) error {
	if len(s.inputs) == 0 || s.spec(name) != nil {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "service %q: unknown input %q (declared: %s)", s.name, name, s.inputNames())
}

func (s *serviceInfo) spec(name string) *config.TensorSpec {
	for i := range s.inputs {
		if s.inputs[i].Name == name {
			return &s.inputs[i]
		}
	}
	return nil
}

func (s *serviceInfo) inputNames() string {
	out := ""
	for i, in := range s.inputs {
		if i > 0 {
			out += ", "
		}
		out += in.Name
	}
	return out
}

var errSpec = errors.New("frontend: tensor does not match the service's declared input")

// checkSpec compares datatype and shape with a declared input (-1 matches
// any size; an empty declared datatype matches any).
func checkSpec(spec *config.TensorSpec, t *hamsv1.Tensor) error {
	if spec.Datatype != "" && spec.Datatype != t.GetDatatype() {
		return fmt.Errorf("%w: datatype %s, want %s", errSpec, t.GetDatatype(), spec.Datatype)
	}
	if spec.Shape == nil {
		return nil
	}
	if len(spec.Shape) != len(t.GetShape()) {
		return fmt.Errorf("%w: shape %v has rank %d, want %v", errSpec, t.GetShape(), len(t.GetShape()), spec.Shape)
	}
	for d, want := range spec.Shape {
		if want >= 0 && t.GetShape()[d] != want {
			return fmt.Errorf("%w: shape %v, want %v (dimension %d)", errSpec, t.GetShape(), spec.Shape, d)
		}
	}
	return nil
}

// checkRows refuses a request with a tensor of more than maxRows rows
// (dimension 0; limits.max_rows_per_request): InvalidArgument naming the
// tensor, as TF Serving and Triton refuse a batch over their maximum.
func (s *serviceInfo) checkRows(inputs []*hamsv1.Tensor, maxRows int) error {
	if maxRows <= 0 {
		return nil
	}
	for _, t := range inputs {
		if sh := t.GetShape(); len(sh) > 0 && sh[0] > int64(maxRows) {
			return status.Errorf(codes.InvalidArgument, "service %q: input %q: %d rows, over the limit of %d rows per request (limits.max_rows_per_request)",
				s.name, t.GetName(), sh[0], maxRows)
		}
	}
	return nil
}

// checkFinite refuses NaN and ±Inf in floating-point inputs when the
// service asks for it (limits.reject_non_finite): InvalidArgument naming
// the tensor and the element.
func (s *serviceInfo) checkFinite(inputs []*hamsv1.Tensor) error {
	if !s.rejectNonFinite {
		return nil
	}
	for _, t := range inputs {
		if i, what, bad := tensor.FirstNonFinite(t); bad {
			return status.Errorf(codes.InvalidArgument, "service %q: input %q: element %d is %s; non-finite values are refused (limits.reject_non_finite)",
				s.name, t.GetName(), i, what)
		}
	}
	return nil
}
