package tensor

import (
	"errors"
	"fmt"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// AnyInput is the input name by which a model declares that it takes every
// tensor its predecessors send, in predecessor order.
const AnyInput = "*"

// Part is what SelectInputs reads of one predecessor's output: its
// tensors (*hamsv1.Item has the method; List wraps a plain slice).
type Part interface {
	GetTensors() []*hamsv1.Tensor
}

// List is a predecessor's output as a plain slice of tensors.
type List []*hamsv1.Tensor

// GetTensors returns l.
func (l List) GetTensors() []*hamsv1.Tensor { return l }

// TakesAnyInput reports whether a model with the declared inputs specs
// takes every tensor of its predecessors: it declares none, or AnyInput.
func TakesAnyInput(specs []*hamsv1.TensorSpec) bool {
	if len(specs) == 0 {
		return true
	}
	for _, s := range specs {
		if s.GetName() == AnyInput {
			return true
		}
	}
	return false
}

// PickInputs picks a model's inputs from its predecessors' outputs
// (parts, in predecessor order), the one rule of the sidecar and of the
// benchmark's direct chain: every tensor of every part when the model
// takes any input (TakesAnyInput), else for each declared input the first
// tensor of that name, of the declared datatype when one is declared. It
// checks nothing else (the direct chain's baseline does no more work than
// that); SelectInputs validates too.
func PickInputs[P Part](specs []*hamsv1.TensorSpec, parts []P) ([]*hamsv1.Tensor, error) {
	var ins []*hamsv1.Tensor
	if TakesAnyInput(specs) {
		if len(parts) == 1 {
			ins = parts[0].GetTensors()
		} else {
			for _, p := range parts {
				ins = append(ins, p.GetTensors()...)
			}
		}
	} else {
		ins = make([]*hamsv1.Tensor, 0, len(specs))
		for _, spec := range specs {
			t := findTensor(parts, spec.GetName())
			if t == nil {
				return nil, fmt.Errorf("missing input %q", spec.GetName())
			}
			if spec.GetDatatype() != "" && t.GetDatatype() != spec.GetDatatype() {
				return nil, fmt.Errorf("input %q: datatype %s, want %s", spec.GetName(), t.GetDatatype(), spec.GetDatatype())
			}
			ins = append(ins, t)
		}
	}
	if len(ins) == 0 {
		return nil, errors.New("no input tensors")
	}
	return ins, nil
}

// SelectInputs is PickInputs, then every input is validated and they must
// agree on their rows (dimension 0, the batch), which are returned.
func SelectInputs[P Part](specs []*hamsv1.TensorSpec, parts []P) ([]*hamsv1.Tensor, uint32, error) {
	ins, err := PickInputs(specs, parts)
	if err != nil {
		return nil, 0, err
	}
	var rows int64 = -1
	for _, t := range ins {
		if err := Validate(t); err != nil {
			return nil, 0, err
		}
		if len(t.GetShape()) == 0 {
			return nil, 0, fmt.Errorf("input %q is a scalar (batch dimension 0 required)", t.GetName())
		}
		r := t.GetShape()[0]
		if rows >= 0 && r != rows {
			return nil, 0, fmt.Errorf("input %q has %d rows, other inputs %d", t.GetName(), r, rows)
		}
		rows = r
	}
	if rows > 1<<31 {
		return nil, 0, fmt.Errorf("input of %d rows", rows)
	}
	return ins, uint32(rows), nil
}

// findTensor is the first tensor called name in parts.
func findTensor[P Part](parts []P, name string) *hamsv1.Tensor {
	for _, p := range parts {
		for _, t := range p.GetTensors() {
			if t.GetName() == name {
				return t
			}
		}
	}
	return nil
}
