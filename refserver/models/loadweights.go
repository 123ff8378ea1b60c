package models

import (
	"errors"
	"fmt"

	"github.com/hams-go/hams/refserver/nn"
)

// ErrNoWeights: the model kind has no weights that can be replaced
// (LoadWeights; the server answers Unimplemented).
var ErrNoWeights = errors.New("models: kind has no replaceable weights")

// LoadWeights replaces the weights of a network kind (classifier, mlp)
// while it serves: a parity model trained online (sidecar/pool). b is a
// weights file (HAMSNETW, or the legacy MLP formats); it must keep the
// model's input and output widths, and its output kind (a parity model
// stays linear). Batches computing keep the weights they started with.
// Other kinds: ErrNoWeights.
func LoadWeights(m Model, b []byte) error {
	c, ok := m.(*core)
	if !ok {
		return ErrNoWeights
	}
	k, ok := c.k.(*network)
	if !ok {
		return fmt.Errorf("%w (kind %s)", ErrNoWeights, c.kind)
	}
	return k.load(b)
}

func (k *network) load(b []byte) error {
	net, err := nn.DecodeNet(b)
	if err != nil {
		return fmt.Errorf("models: load weights: %w", err)
	}
	k.netMu.Lock()
	defer k.netMu.Unlock()
	if net.InSize() != k.net.InSize() || net.OutSize() != k.net.OutSize() {
		return fmt.Errorf("models: load weights: a %d -> %d network, the model serves %d -> %d", net.InSize(), net.OutSize(), k.net.InSize(), k.net.OutSize())
	}
	if net.Softmax != k.net.Softmax {
		return fmt.Errorf("models: load weights: softmax output %v, the model serves softmax %v", net.Softmax, k.net.Softmax)
	}
	k.net = net
	return nil
}
