package nn

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// The network weights file (EncodeNet / DecodeNet), little-endian:
//
//	[8]byte  magic "HAMSNETW"
//	uint32   format version (NetFormatVersion)
//	uint32   header length L (<= 1 MiB)
//	[L]byte  header, JSON: {"layers": [LayerSpec...], "output": "softmax"|"linear", "meta": {...}}
//	float32  every parameter, in Net.Params order (layer by layer, weights then bias)
//
// The length of the file must be exactly what the header's layers need.
// Older single-hidden-layer files (HAMSMLP1 / HAMSMLPL) are read by
// refserver/models.DecodeMLP.
const (
	// NetMagic opens a network weights file.
	NetMagic = "HAMSNETW"
	// NetFormatVersion is the version EncodeNet writes and the only one
	// DecodeNet reads.
	NetFormatVersion = 1
	maxHeader        = 1 << 20
)

// ErrFormat is wrapped by every DecodeNet error.
var ErrFormat = errors.New("nn: bad network weights file")

type netHeader struct {
	Layers []LayerSpec      `json:"layers"`
	Output string           `json:"output"`
	Meta   *json.RawMessage `json:"meta,omitempty"`
}

// EncodeNet serialises n (architecture, output kind, Meta, parameters).
// Meta must be empty or valid JSON.
func EncodeNet(n *Net) ([]byte, error) {
	if err := n.Check(); err != nil {
		return nil, err
	}
	h := netHeader{Output: "linear"}
	if n.Softmax {
		h.Output = "softmax"
	}
	for _, l := range n.Layers {
		h.Layers = append(h.Layers, l.Spec())
	}
	if len(n.Meta) > 0 {
		if !json.Valid(n.Meta) {
			return nil, fmt.Errorf("nn: encode net: meta is not valid JSON")
		}
		m := json.RawMessage(n.Meta)
		h.Meta = &m
	}
	hdr, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("nn: encode net: header: %w", err)
	}
	if len(hdr) > maxHeader {
		return nil, fmt.Errorf("nn: encode net: header of %d bytes exceeds %d", len(hdr), maxHeader)
	}
	b := make([]byte, 0, 16+len(hdr)+4*n.NumParams())
	b = append(b, NetMagic...)
	b = binary.LittleEndian.AppendUint32(b, NetFormatVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(hdr)))
	b = append(b, hdr...)
	for _, p := range n.Params() {
		for _, v := range p {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	}
	return b, nil
}

// DecodeNet parses EncodeNet's format. A wrong magic, an unknown version,
// a malformed header, layers that do not chain, a length that does not
// match the layers, or a non-finite weight is an ErrFormat error naming
// the problem.
func DecodeNet(b []byte) (*Net, error) {
	if len(b) < 16 || string(b[:8]) != NetMagic {
		return nil, fmt.Errorf("%w: magic %q, want %q", ErrFormat, b[:min(len(b), 8)], NetMagic)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != NetFormatVersion {
		return nil, fmt.Errorf("%w: format version %d, this build reads version %d", ErrFormat, v, NetFormatVersion)
	}
	hl := binary.LittleEndian.Uint32(b[12:])
	if hl > maxHeader || int(hl) > len(b)-16 {
		return nil, fmt.Errorf("%w: header length %d with %d bytes after it", ErrFormat, hl, len(b)-16)
	}
	var h netHeader
	if err := json.Unmarshal(b[16:16+hl], &h); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrFormat, err)
	}
	n := &Net{}
	switch h.Output {
	case "softmax":
		n.Softmax = true
	case "linear":
	default:
		return nil, fmt.Errorf("%w: output %q, want softmax or linear", ErrFormat, h.Output)
	}
	if h.Meta != nil {
		n.Meta = []byte(*h.Meta)
	}
	total := 0
	for i, s := range h.Layers {
		l, err := NewLayer(s)
		if err != nil {
			return nil, fmt.Errorf("%w: layer %d: %v", ErrFormat, i, err)
		}
		for _, p := range l.Params() {
			total += len(p)
		}
		if total > 1<<28 {
			return nil, fmt.Errorf("%w: more than %d parameters", ErrFormat, 1<<28)
		}
		n.Layers = append(n.Layers, l)
	}
	if err := n.Check(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	rest := b[16+hl:]
	if len(rest) != 4*total {
		return nil, fmt.Errorf("%w: %d bytes of parameters, the layers need %d (%d values)", ErrFormat, len(rest), 4*total, total)
	}
	for _, p := range n.Params() {
		for i := range p {
			v := math.Float32frombits(binary.LittleEndian.Uint32(rest))
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return nil, fmt.Errorf("%w: non-finite parameter %v", ErrFormat, v)
			}
			p[i] = v
			rest = rest[4:]
		}
	}
	return n, nil
}
