// Package examples embeds the example deployments: the six services of the
// HAMS paper's Fig. 8/9 (sa, sp, ap, fd, olv, olm, one file each),
// retrofit.yaml (one Fashion-MNIST classifier for `hams up`), and in
// paper/ the same six services with paper-scale models (compute per batch
// of 64 in the tens to hundreds of milliseconds, as the paper's GPU models
// take; for benchmarks).
package examples

import (
	"embed"
	"fmt"

	"github.com/hams-go/hams/internal/config"
)

//go:embed *.yaml paper/*.yaml
var files embed.FS

var names = []string{"sa", "sp", "ap", "fd", "olv", "olm"}

// Names lists the six example services in the paper's order.
func Names() []string { return append([]string(nil), names...) }

// Raw returns the YAML of example name ("sa" ... "olm", or "retrofit").
func Raw(name string) ([]byte, error) {
	b, err := files.ReadFile(name + ".yaml")
	if err != nil {
		return nil, fmt.Errorf("examples: no example %q: %w", name, err)
	}
	return b, nil
}

// Sets of the six services: the default models, and paper-scale ones.
const (
	SetDefault = "default"
	SetPaper   = "paper"
)

// RawSet returns the YAML of service name in set (SetDefault: Raw).
func RawSet(set, name string) ([]byte, error) {
	switch set {
	case SetDefault, "":
		return Raw(name)
	case SetPaper:
		b, err := files.ReadFile("paper/" + name + ".yaml")
		if err != nil {
			return nil, fmt.Errorf("examples: no paper-scale example %q: %w", name, err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("examples: unknown set %q (%s or %s)", set, SetDefault, SetPaper)
}

// Load parses and validates example name.
func Load(name string) (*config.Deployment, error) {
	b, err := Raw(name)
	if err != nil {
		return nil, err
	}
	d, err := config.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("examples: %s.yaml: %w", name, err)
	}
	return d, nil
}
