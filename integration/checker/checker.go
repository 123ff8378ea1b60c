package checker

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// ErrViolation is wrapped by every error Check returns for a bad reply.
var ErrViolation = errors.New("checker: violation")

// Kinds of violation, the keys of Summary.ByKind.
const (
	KindError     = "error"     // the reply carries an error (or the call failed, via Failed)
	KindOutputs   = "outputs"   // missing/extra sink output, wrong tensor name, datatype, shape or rows
	KindLineage   = "lineage"   // a model of the graph is missing from the lineage, or a pred link dangles
	KindConflict  = "conflict"  // a (model, seq) pair in two different replies
	KindDuplicate = "duplicate" // a second reply to one request
	KindUnknown   = "unknown"   // a reply to a request never sent (or for the wrong service)
	KindLost      = "lost"      // a request without reply or error (Finish)
	// KindSeqReuse is a conflict that a restart of the model explains: a
	// (model, seq) pair in two replies, where the model was restarted
	// (Restarted) after the first request was sent and before the second
	// reply arrived. A restarted instance that numbers its requests from 1
	// again causes it; recovery that continues the sequence (issue 4,
	// paper IV-E) must leave none. It is a violation like the others,
	// counted on its own so a run can tell it from a conflict within one
	// incarnation.
	KindSeqReuse = "seq_reuse"
)

// Service is what the checker needs to know about one service.
type Service struct {
	Name string
	// Models of the graph and its sinks.
	Models []string
	Sinks  []string
	// Outputs declared by each sink's Describe (may be absent for a sink
	// whose description is unknown: then only presence is checked).
	Outputs map[string][]*hamsv1.TensorSpec
}

// ServiceOf builds a Service from the deployment and the sinks' descriptions.
func ServiceOf(d *config.Deployment, name string, descs map[string]*hamsv1.ModelDescription) (Service, error) {
	s := d.Service(name)
	if s == nil {
		return Service{}, fmt.Errorf("checker: unknown service %q", name)
	}
	g := s.Graph()
	out := Service{Name: name, Models: g.Models(), Sinks: g.Sinks(), Outputs: map[string][]*hamsv1.TensorSpec{}}
	for _, m := range out.Sinks {
		if d, ok := descs[m]; ok && d != nil {
			out.Outputs[m] = d.Outputs
		}
	}
	return out, nil
}

type seqKey struct {
	model string
	seq   uint64
}

// Checker checks replies of one or more services.
type Checker struct {
	mu       sync.Mutex
	services map[string]Service
	// pending requests: request key -> service; answered: key -> true.
	sent     map[string]sentReq
	answered map[string]bool
	owner    map[seqKey]string // (model, seq) -> request key of the reply that carried it
	restarts map[string][]time.Time
	sum      Summary
	now      func() time.Time
}

type sentReq struct {
	service string
	rows    int64
	at      time.Time
}

// Summary counts what the checker saw.
type Summary struct {
	Sent       int            `json:"sent"`
	Replies    int            `json:"replies"`
	Correct    int            `json:"correct"`
	Errors     int            `json:"errors"`
	Violations int            `json:"violations"`
	ByKind     map[string]int `json:"by_kind,omitempty"`
	// First few violation messages, for humans.
	Examples []string `json:"examples,omitempty"`
}

// New returns a checker for the given services.
func New(services ...Service) *Checker {
	c := &Checker{services: map[string]Service{}, sent: map[string]sentReq{}, answered: map[string]bool{}, owner: map[seqKey]string{},
		restarts: map[string][]time.Time{}, now: time.Now}
	for _, s := range services {
		c.services[s.Name] = s
	}
	c.sum.ByKind = map[string]int{}
	return c
}

// Sent registers a request about to be sent under a unique key (its
// request_id); its rows are those of its first input tensor.
func (c *Checker) Sent(key string, req *hamsv1.PredictRequest) {
	rows := int64(-1)
	if len(req.Inputs) > 0 && len(req.Inputs[0].Shape) > 0 {
		rows = req.Inputs[0].Shape[0]
	}
	c.mu.Lock()
	c.sent[key] = sentReq{service: req.Service, rows: rows, at: c.now()}
	c.sum.Sent++
	c.mu.Unlock()
}

// Restarted records that model's instance was replaced (killed and
// restarted) at time at; conflicts on model across that moment are
// counted as KindSeqReuse.
func (c *Checker) Restarted(model string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.restarts[model] = append(c.restarts[model], at)
}

// restartedBetween reports whether model was restarted in (from, to).
func (c *Checker) restartedBetween(model string, from, to time.Time) bool {
	for _, t := range c.restarts[model] {
		if t.After(from) && t.Before(to) {
			return true
		}
	}
	return false
}

// Failed records that the request got an error instead of a reply. It is
// counted in Errors, not as a violation: callers decide whether errors are
// acceptable (they are not in a run without failures).
func (c *Checker) Failed(key string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.answered[key] {
		c.violate(KindDuplicate, "request %s: error %v after an earlier answer", key, err)
		return
	}
	c.answered[key] = true
	c.sum.Errors++
}

func (c *Checker) violate(kind, format string, a ...any) error {
	c.sum.Violations++
	c.sum.ByKind[kind]++
	msg := fmt.Sprintf("%s: ", kind) + fmt.Sprintf(format, a...)
	if len(c.sum.Examples) < 10 {
		c.sum.Examples = append(c.sum.Examples, msg)
	}
	return fmt.Errorf("%w: %s", ErrViolation, msg)
}

// Check verifies one reply to the request registered under key, and the
// (model, seq) pairs it carries against every earlier reply. It returns
// all violations found, joined (nil for a correct reply).
func (c *Checker) Check(key string, resp *hamsv1.PredictResponse) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sum.Replies++
	req, ok := c.sent[key]
	if !ok {
		return c.violate(KindUnknown, "reply to request %s that was never sent", key)
	}
	if c.answered[key] {
		return c.violate(KindDuplicate, "second reply to request %s", key)
	}
	c.answered[key] = true
	svc, ok := c.services[req.service]
	if !ok {
		return c.violate(KindUnknown, "request %s: service %q is not checked", key, req.service)
	}
	var errs []error
	if resp.Service != "" && resp.Service != svc.Name {
		errs = append(errs, c.violate(KindUnknown, "request %s for service %s answered by service %s", key, svc.Name, resp.Service))
	}
	errs = append(errs, c.checkOutputs(key, svc, req.rows, resp)...)
	errs = append(errs, c.checkLineage(key, svc, resp)...)
	if len(errs) == 0 {
		c.sum.Correct++
	}
	return errors.Join(errs...)
}

func (c *Checker) checkOutputs(key string, svc Service, rows int64, resp *hamsv1.PredictResponse) []error {
	var errs []error
	got := map[string]*hamsv1.ModelOutput{}
	for _, o := range resp.Outputs {
		if got[o.Model] != nil {
			errs = append(errs, c.violate(KindOutputs, "request %s: two outputs of model %s", key, o.Model))
		}
		got[o.Model] = o
		if !slices.Contains(svc.Sinks, o.Model) {
			errs = append(errs, c.violate(KindOutputs, "request %s: output of %s, which is not a sink of %s", key, o.Model, svc.Name))
		}
	}
	for _, sink := range svc.Sinks {
		o := got[sink]
		if o == nil {
			errs = append(errs, c.violate(KindOutputs, "request %s: no output of sink %s", key, sink))
			continue
		}
		specs, known := svc.Outputs[sink]
		if !known {
			continue
		}
		for _, spec := range specs {
			t := findTensor(o.Tensors, spec.Name)
			if t == nil {
				errs = append(errs, c.violate(KindOutputs, "request %s: sink %s: no output tensor %q", key, sink, spec.Name))
				continue
			}
			if t.Datatype != spec.Datatype {
				errs = append(errs, c.violate(KindOutputs, "request %s: sink %s tensor %s: datatype %s, declared %s", key, sink, spec.Name, t.Datatype, spec.Datatype))
			}
			if !trailingMatch(t.Shape, spec.Shape) {
				errs = append(errs, c.violate(KindOutputs, "request %s: sink %s tensor %s: shape %v, declared %v", key, sink, spec.Name, t.Shape, spec.Shape))
			} else if rows >= 0 && (len(t.Shape) == 0 || t.Shape[0] != rows) {
				errs = append(errs, c.violate(KindOutputs, "request %s: sink %s tensor %s: shape %v, request had %d rows", key, sink, spec.Name, t.Shape, rows))
			}
			if err := validate(t); err != nil {
				errs = append(errs, c.violate(KindOutputs, "request %s: sink %s tensor %s: %v", key, sink, spec.Name, err))
			}
		}
		if len(o.Tensors) != len(specs) {
			errs = append(errs, c.violate(KindOutputs, "request %s: sink %s: %d output tensors, declared %d", key, sink, len(o.Tensors), len(specs)))
		}
	}
	return errs
}

func (c *Checker) checkLineage(key string, svc Service, resp *hamsv1.PredictResponse) []error {
	var errs []error
	has := map[seqKey]bool{}
	models := map[string]bool{}
	for _, e := range resp.Lineage {
		has[seqKey{e.Model, e.Seq}] = true
		models[e.Model] = true
	}
	var missing []string
	for _, m := range svc.Models {
		if !models[m] {
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		errs = append(errs, c.violate(KindLineage, "request %s: lineage lacks models %s", key, strings.Join(missing, ", ")))
	}
	for _, e := range resp.Lineage {
		if !slices.Contains(svc.Models, e.Model) {
			errs = append(errs, c.violate(KindLineage, "request %s: lineage names %s, not a model of %s", key, e.Model, svc.Name))
		}
		if e.Seq == 0 {
			errs = append(errs, c.violate(KindLineage, "request %s: lineage entry of %s without a seq", key, e.Model))
		}
		if e.PredModel != config.Frontend && !has[seqKey{e.PredModel, e.PredSeq}] {
			errs = append(errs, c.violate(KindLineage, "request %s: %s seq %d names pred %s seq %d, which the reply's lineage lacks", key, e.Model, e.Seq, e.PredModel, e.PredSeq))
		}
	}
	keys := make([]seqKey, 0, len(has))
	for k := range has {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].model != keys[j].model {
			return keys[i].model < keys[j].model
		}
		return keys[i].seq < keys[j].seq
	})
	for _, k := range keys {
		if other, ok := c.owner[k]; ok && other != key {
			if c.restartedBetween(k.model, c.sent[other].at, c.now()) {
				errs = append(errs, c.violate(KindSeqReuse, "%s seq %d appears in the replies to %s and %s, across a restart of %s", k.model, k.seq, other, key, k.model))
				continue
			}
			errs = append(errs, c.violate(KindConflict, "%s seq %d appears in the replies to %s and %s", k.model, k.seq, other, key))
			continue
		}
		c.owner[k] = key
	}
	return errs
}

// Finish counts every sent request without reply or error as lost and
// returns the summary.
func (c *Checker) Finish() Summary {
	c.mu.Lock()
	defer c.mu.Unlock()
	var lost []string
	for k := range c.sent {
		if !c.answered[k] {
			lost = append(lost, k)
		}
	}
	sort.Strings(lost)
	for _, k := range lost {
		c.violate(KindLost, "request %s got no reply", k)
		c.answered[k] = true
	}
	return c.Summary()
}

// Summary returns the counts so far (without declaring anything lost).
func (c *Checker) Summary() Summary {
	s := c.sum
	s.ByKind = map[string]int{}
	for k, v := range c.sum.ByKind {
		s.ByKind[k] = v
	}
	s.Examples = slices.Clone(c.sum.Examples)
	return s
}

func findTensor(ts []*hamsv1.Tensor, name string) *hamsv1.Tensor {
	for _, t := range ts {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// trailingMatch compares all dims but the first; -1 in decl matches any.
func trailingMatch(got, decl []int64) bool {
	if len(got) != len(decl) {
		return false
	}
	for i := 1; i < len(got); i++ {
		if decl[i] >= 0 && got[i] != decl[i] {
			return false
		}
	}
	return true
}
