package config

import (
	"fmt"
	"net"
	"strings"

	"gopkg.in/yaml.v3"
)

// Redundancy is how a replica pool protects a stateless model against
// stragglers (docs/design.md, "Parity models").
type Redundancy string

// Redundancy values.
const (
	// RedundancyNone: the m replicas only.
	RedundancyNone Redundancy = "none"
	// RedundancyER (Equal-Resources): the parity slots serve copies of the
	// deployed model instead of parity models (the same hardware as parm).
	RedundancyER Redundancy = "er"
	// RedundancyHedge: er, plus a batch still running after the hedge delay
	// is sent again to an idle copy; the first answer wins.
	RedundancyHedge Redundancy = "hedge"
	// RedundancyParM: coding groups of k batches, parity models on the
	// parity slots, reconstruction of a missing output.
	RedundancyParM Redundancy = "parm"
)

// Redundancies lists the valid values, in the order benchmarks report them.
var Redundancies = []Redundancy{RedundancyNone, RedundancyER, RedundancyHedge, RedundancyParM}

// ParseRedundancy reads a redundancy name.
func ParseRedundancy(s string) (Redundancy, error) {
	for _, r := range Redundancies {
		if string(r) == s {
			return r, nil
		}
	}
	return "", invalid("redundancy %q is not one of %s", s, joinRedundancies())
}

func joinRedundancies() string {
	var out []string
	for _, r := range Redundancies {
		out = append(out, string(r))
	}
	return strings.Join(out, ", ")
}

// UsesParitySlots reports whether the pool runs instances on the parity
// slots (as parity models for parm, as copies of the model for er and
// hedge).
func (r Redundancy) UsesParitySlots() bool {
	return r == RedundancyER || r == RedundancyHedge || r == RedundancyParM
}

// Instances is a list of backend instances in YAML: either a count (the
// deployment starts that many servers, as it starts any managed backend)
// or a list of host:port addresses of servers that already run.
type Instances struct {
	Count     int
	Addresses []string
}

// UnmarshalYAML reads an integer or a sequence of addresses.
func (in *Instances) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		var c int
		if err := n.Decode(&c); err != nil {
			return fmt.Errorf("line %d: a number of instances or a list of host:port addresses: %w", n.Line, err)
		}
		*in = Instances{Count: c}
		if c < 1 {
			return fmt.Errorf("line %d: %d instances (at least 1)", n.Line, c)
		}
		return nil
	case yaml.SequenceNode:
		var a []string
		if err := n.Decode(&a); err != nil {
			return fmt.Errorf("line %d: addresses: %w", n.Line, err)
		}
		*in = Instances{Addresses: a}
		if len(a) == 0 {
			return fmt.Errorf("line %d: an empty list of instances", n.Line)
		}
		return nil
	}
	return fmt.Errorf("line %d: a number of instances or a list of host:port addresses", n.Line)
}

// MarshalYAML writes the addresses when known, else the count.
func (in Instances) MarshalYAML() (any, error) {
	if len(in.Addresses) > 0 {
		return in.Addresses, nil
	}
	return in.Count, nil
}

// IsZero lets omitempty drop an unset list.
func (in Instances) IsZero() bool { return in.Count == 0 && len(in.Addresses) == 0 }

// N is the number of instances.
func (in Instances) N() int {
	if len(in.Addresses) > 0 {
		return len(in.Addresses)
	}
	return in.Count
}

// Managed reports whether the deployment starts the instances.
func (in Instances) Managed() bool { return len(in.Addresses) == 0 && in.Count > 0 }

// Decode says when a coding group's missing output is reconstructed.
type Decode string

// Decode values.
const (
	// DecodeFirstK: as soon as enough outputs of the group are in and a
	// data output is missing (the paper's rule).
	DecodeFirstK Decode = "first-k"
)

// Parity configures the ParM path of a replica pool (redundancy parm).
type Parity struct {
	// K: batches per coding group (>= 2).
	K int `yaml:"k"`
	// R: parity models per group (default 1); parity j is trained for
	// sum_i (i+1)^j F(X_i) (protocol/parity.Coefficient).
	R int `yaml:"r"`
	// Encoder: sum (default) or concat (images; Image gives the layout).
	Encoder string `yaml:"encoder"`
	// Image is [height, width, channels] of one query, for concat.
	Image []int `yaml:"image,omitempty"`
	// Decode: first-k (default).
	Decode Decode `yaml:"decode"`
	// DecodeAfter: once a reconstruction is possible, how much longer the
	// original may take before the reconstruction is released (0: at once).
	DecodeAfter Duration `yaml:"decode_after"`
	// FillAfter: a coding group still short of k batches this long after
	// its first one is completed with recently answered batches (their
	// outputs are known), so a straggler under light load waits for no
	// more arrivals (0: groups fill with new batches only, the paper's
	// rule).
	FillAfter Duration `yaml:"fill_after,omitempty"`
	// Backends are the parity instances (a count started by the
	// deployment, or addresses); default max(r, replicas/k). Under er and
	// hedge these slots serve copies of the deployed model instead (the
	// same hardware as parm): started ones run the model, addresses must
	// name servers of the model.
	Backends Instances `yaml:"backends,omitempty"`
	// Model is the parity model at the backend (default
	// "<backend.model>-parity"): parity 0's, and for r > 1 parity j's is
	// Model + "-p<j>" (ModelName), each trained for its own coefficients.
	Model string `yaml:"model"`
	// Kind and Params are the reference model server's parity model, for
	// backends the deployment starts (e.g. kind parity-mlp, params
	// {weights: fashion-parity-sum-k2}); default: the deployed model's own
	// kind and params (exact for a linear model without bias).
	Kind   string         `yaml:"kind"`
	Params map[string]any `yaml:"params,omitempty"`
	// Train: "" (the parity models' weights as given) or "online": the
	// pool trains them from live traffic and swaps them in (parity
	// backends of type reference); until the first swap nothing is
	// reconstructed. Online bounds what training may use.
	Train  string       `yaml:"train,omitempty"`
	Online *OnlineTrain `yaml:"online,omitempty"`
}

// OnlineTrain bounds online parity training (sidecar/pool.OnlineConfig;
// zero fields take its defaults).
type OnlineTrain struct {
	// Arch: mlp (784-200-100-out), mlp:H1,H2,..., lenet.
	Arch string `yaml:"arch,omitempty"`
	// Buffer and Holdout: samples kept for training and for evaluation
	// (memory: their sum times the query and output widths, in floats).
	Buffer  int `yaml:"buffer,omitempty"`
	Holdout int `yaml:"holdout,omitempty"`
	// MinSamples before the first round; Every: at most one round this
	// often.
	MinSamples int      `yaml:"min_samples,omitempty"`
	Every      Duration `yaml:"every,omitempty"`
	// Epochs per round and Workers (cores): the CPU it takes.
	Epochs  int `yaml:"epochs,omitempty"`
	Workers int `yaml:"workers,omitempty"`
	// MinAgreement with the deployed model's top-1 before weights serve.
	MinAgreement float64 `yaml:"min_agreement,omitempty"`
}

// Straggle injects stragglers into the reference model servers a
// deployment starts for a pool (tests, benchmarks, the demo). Spec is the
// model server's --straggle value (refserver.ParseStraggle).
type Straggle struct {
	// Replicas are the indexes (0-based) of the data replicas that
	// straggle.
	Replicas []int `yaml:"replicas"`
	// Spec is the schedule, e.g. "seed=7,period=200ms,fraction=0.2,delay=40ms".
	Spec string `yaml:"spec"`
}

// Pooled reports whether m is served by a replica pool.
func (m *Model) Pooled() bool { return !m.Replicas.IsZero() }

// ParitySlots is the number of parity slots of m's pool (0 without).
func (m *Model) ParitySlots() int {
	if m.Parity == nil || !m.Redundancy.UsesParitySlots() {
		return 0
	}
	return m.Parity.Backends.N()
}

func (m *Model) applyPoolDefaults() {
	if !m.Pooled() {
		return
	}
	if m.Redundancy == "" {
		m.Redundancy = RedundancyNone
		if m.Parity != nil {
			m.Redundancy = RedundancyParM
		}
	}
	p := m.Parity
	if p == nil {
		return
	}
	if p.R == 0 {
		p.R = 1
	}
	if p.Encoder == "" {
		p.Encoder = "sum"
	}
	if p.Decode == "" {
		p.Decode = DecodeFirstK
	}
	if p.Backends.IsZero() && p.K >= 2 {
		p.Backends.Count = max(p.R, (m.Replicas.N()+p.K-1)/p.K)
	}
	if p.Model == "" {
		p.Model = m.Backend.Model + "-parity"
	}
}

// validatePool checks a pool's fields; where names the model.
func (m *Model) validatePool(where string, inputs []TensorSpec) []error {
	var errs []error
	if !m.Pooled() {
		if m.Parity != nil || m.Redundancy != "" || m.HedgeAfter != 0 || m.Straggle != nil {
			errs = append(errs, invalid("%s: redundancy, parity, hedge_after and straggle need replicas (a replica pool)", where))
		}
		return errs
	}
	if m.Stateful {
		errs = append(errs, invalid("%s: replicas (a replica pool) and parity are for stateless models; a stateful model is protected by its backup", where))
	}
	if m.HA == "off" {
		errs = append(errs, invalid("%s: ha off has no sidecar to run a replica pool", where))
	}
	for i, a := range m.Replicas.Addresses {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, invalid("%s: replicas[%d] %q is not host:port", where, i, a))
		}
	}
	if m.Backend.Address != "" {
		errs = append(errs, invalid("%s: backend.address and replicas both name servers; list every instance under replicas", where))
	}
	if _, err := ParseRedundancy(string(m.Redundancy)); err != nil {
		errs = append(errs, invalid("%s: %v", where, strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": ")))
	}
	if m.HedgeAfter < 0 {
		errs = append(errs, invalid("%s: negative hedge_after", where))
	}
	if m.HedgeAfter != 0 && m.Redundancy != RedundancyHedge {
		errs = append(errs, invalid("%s: hedge_after is for redundancy hedge", where))
	}
	if m.Straggle != nil {
		if !m.Replicas.Managed() {
			errs = append(errs, invalid("%s: straggle injects delays into model servers the deployment starts (replicas: N), not into servers at addresses", where))
		}
		for _, r := range m.Straggle.Replicas {
			if r < 0 || r >= m.Replicas.N() {
				errs = append(errs, invalid("%s: straggle.replicas names replica %d of %d", where, r, m.Replicas.N()))
			}
		}
		if m.Straggle.Spec == "" {
			errs = append(errs, invalid("%s: straggle without a spec", where))
		}
	}
	p := m.Parity
	switch {
	case m.Redundancy == RedundancyParM && p == nil:
		errs = append(errs, invalid("%s: redundancy parm needs a parity block (k, backends)", where))
	case m.Redundancy == RedundancyNone && p != nil:
		// A parity block under none is kept (benchmarks flip redundancy)
		// but unused.
	}
	if p == nil {
		return errs
	}
	if p.K < 2 {
		errs = append(errs, invalid("%s: parity.k %d: a coding group needs at least 2 batches", where, p.K))
	}
	if p.K > 16 {
		errs = append(errs, invalid("%s: parity.k %d: at most 16", where, p.K))
	}
	if p.R < 1 || p.R > 4 {
		errs = append(errs, invalid("%s: parity.r %d out of range 1..4", where, p.R))
	}
	switch p.Encoder {
	case "sum":
		if len(p.Image) > 0 {
			errs = append(errs, invalid("%s: parity.image is for encoder concat", where))
		}
	case "concat":
		if len(p.Image) != 3 || p.Image[0] < 1 || p.Image[1] < 1 || p.Image[2] < 1 {
			errs = append(errs, invalid("%s: parity encoder concat is for images: parity.image must be [height, width, channels], got %v", where, p.Image))
		} else {
			size := int64(p.Image[0] * p.Image[1] * p.Image[2])
			for _, in := range inputs {
				if w := rowWidth(in.Shape); w > 0 && w != size {
					errs = append(errs, invalid("%s: parity encoder concat: input %q has %d values per query, not an image of %v (%d)", where, in.Name, w, p.Image, size))
				}
				if in.Datatype != "" && in.Datatype != "FP32" {
					errs = append(errs, invalid("%s: parity encoder concat: input %q is %s, images are FP32", where, in.Name, in.Datatype))
				}
			}
		}
	default:
		errs = append(errs, invalid("%s: parity.encoder %q is not sum or concat", where, p.Encoder))
	}
	switch p.Train {
	case "":
		if p.Online != nil {
			errs = append(errs, invalid("%s: parity.online needs parity.train: online", where))
		}
	case "online":
		if m.Backend.Type != "reference" {
			errs = append(errs, invalid("%s: parity.train online swaps weights into parity servers of backend type reference, not %s", where, m.Backend.Type))
		}
		if o := p.Online; o != nil && (o.Buffer < 0 || o.Holdout < 0 || o.MinSamples < 0 || o.Every < 0 || o.Epochs < 0 || o.Workers < 0 || o.MinAgreement < 0 || o.MinAgreement > 1) {
			errs = append(errs, invalid("%s: parity.online: negative bound or min_agreement outside 0..1", where))
		}
	default:
		errs = append(errs, invalid("%s: parity.train %q is not online (or empty)", where, p.Train))
	}
	if p.Decode != DecodeFirstK {
		errs = append(errs, invalid("%s: parity.decode %q is not %s", where, p.Decode, DecodeFirstK))
	}
	if p.DecodeAfter < 0 || p.FillAfter < 0 {
		errs = append(errs, invalid("%s: negative parity.decode_after or parity.fill_after", where))
	}
	if n := p.Backends.N(); n < p.R && m.Redundancy == RedundancyParM {
		errs = append(errs, invalid("%s: %d parity backends for r = %d parity models (at least r)", where, n, p.R))
	}
	for i, a := range p.Backends.Addresses {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, invalid("%s: parity.backends[%d] %q is not host:port", where, i, a))
		}
	}
	return errs
}

// rowWidth is the number of values per row of a [-1, d1, d2...] shape, or
// 0 when unknown.
func rowWidth(shape []int64) int64 {
	if len(shape) < 2 {
		return 0
	}
	w := int64(1)
	for _, d := range shape[1:] {
		if d < 0 {
			return 0
		}
		w *= d
	}
	return w
}

// ModelName is the name of parity model j (0 <= j < r) at the parity
// backends: Model for j = 0, Model + "-p<j>" after it.
func (p *Parity) ModelName(j int) string {
	if j == 0 {
		return p.Model
	}
	return fmt.Sprintf("%s-p%d", p.Model, j)
}

// WeightsParam is the `weights` param of parity model j of a parity
// server the deployment starts: params.weights for j = 0, with "-p<j>"
// appended after it ("" when params name no weights).
func (p *Parity) WeightsParam(j int) string {
	w, _ := p.Params["weights"].(string)
	if w == "" || j == 0 {
		return w
	}
	return fmt.Sprintf("%s-p%d", w, j)
}
