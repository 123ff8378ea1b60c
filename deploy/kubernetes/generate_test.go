package kubernetes_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"text/template"

	"gopkg.in/yaml.v3"
)

// update rewrites the generated overlays from examples/*.yaml:
// go test ./deploy/kubernetes -run TestOverlaysUpToDate -update
var update = flag.Bool("update", false, "rewrite the generated overlay files")

// services are the example deployments that get an overlay: the six
// services of the paper's Fig. 8/9 and retrofit (Fashion-MNIST).
var services = []string{"ap", "sa", "sp", "fd", "olv", "olm", "retrofit"}

// example is what the generator reads of a deployment YAML.
type example struct {
	Name   string `yaml:"name"`
	Mode   string `yaml:"mode"`
	Models []struct {
		Name      string `yaml:"name"`
		Stateful  bool   `yaml:"stateful"`
		Replicas  int    `yaml:"replicas"`
		HA        string `yaml:"ha"`
		Placement struct {
			Primary string `yaml:"primary"`
			Backup  string `yaml:"backup"`
			Standby string `yaml:"standby"`
		} `yaml:"placement"`
	} `yaml:"models"`
}

// instance is one model instance: one StatefulSet of one pod.
type instance struct {
	Model, Role string
	// Pair: the roles (comma-separated) this instance's pod must not
	// share a node with; PairText says why.
	Pair, PairText string
	Spare          bool
}

// generated returns the overlay files of service svc (path relative to
// deploy/kubernetes -> content).
func generated(t *testing.T, svc string) map[string][]byte {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "..", "examples", svc+".yaml"))
	if err != nil {
		t.Fatalf("read example %s: %v", svc, err)
	}
	var ex example
	if err := yaml.Unmarshal(src, &ex); err != nil {
		t.Fatalf("examples/%s.yaml: %v", svc, err)
	}
	tmplText, err := os.ReadFile("instance.yaml.tmpl")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := template.Must(template.New("instance").Parse(string(tmplText)))
	var serving, spares []instance
	var pdbs bytes.Buffer
	for _, m := range ex.Models {
		if m.Replicas > 1 || m.HA == "off" {
			t.Fatalf("examples/%s.yaml: model %s: replica pools and pass-through models have no generator yet", svc, m.Name)
		}
		switch {
		case m.Stateful && m.Placement.Backup != "":
			pair := "primary, backup"
			serving = append(serving, instance{Model: m.Name, Role: "primary", Pair: pair, PairText: "backup"})
			spares = append(spares,
				instance{Model: m.Name, Role: "backup", Pair: pair, PairText: "primary"},
				instance{Model: m.Name, Role: "standby", Spare: true})
		case !m.Stateful && m.Placement.Standby != "":
			pair := "primary, standby"
			serving = append(serving, instance{Model: m.Name, Role: "primary", Pair: pair, PairText: "hot standby"})
			spares = append(spares, instance{Model: m.Name, Role: "standby", Pair: pair, PairText: "primary"})
		default:
			serving = append(serving, instance{Model: m.Name, Role: "primary"})
		}
		fmt.Fprintf(&pdbs, `---
# A drain evicts at most one instance of %[1]s at a time (evicting the
# serving one is a failover).
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: %[1]s
spec:
  maxUnavailable: 1
  selector:
    matchLabels:
      app.kubernetes.io/component: instance
      hams.dev/model: %[1]s
`, m.Name)
	}
	render := func(head string, insts []instance) []byte {
		var b bytes.Buffer
		b.WriteString(head)
		for _, in := range insts {
			if err := tmpl.Execute(&b, in); err != nil {
				t.Fatal(err)
			}
		}
		return b.Bytes()
	}
	gen := "# Generated from examples/" + svc + ".yaml and instance.yaml.tmpl by\n# `go test ./deploy/kubernetes -run TestOverlaysUpToDate -update`; do not edit.\n"
	dir := filepath.Join("overlays", svc)
	return map[string][]byte{
		filepath.Join(dir, "deployment.yaml"): src,
		filepath.Join(dir, "instances.yaml"):  render(gen+"# The serving instances (phase 1: docs/kubernetes.md, \"Apply\").\n", serving),
		filepath.Join(dir, "pdb.yaml"):        append([]byte(gen), pdbs.Bytes()...),
		filepath.Join(dir, "kustomization.yaml"): []byte(gen + `# ` + svc + `: the control plane (base) and the serving instances. Apply
# spares/ once these are ready (docs/kubernetes.md, "Apply").
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: hams-` + svc + `
labels:
  - pairs:
      hams.dev/deployment: ` + ex.Name + `
    includeSelectors: false
    includeTemplates: true
resources:
  - namespace.yaml
  - ../../base
  - instances.yaml
  - pdb.yaml
configMapGenerator:
  # The deployment YAML every component reads (--config): a copy of
  # examples/` + svc + `.yaml. No name hash: spares/ refers to it by name, and
  # a changed deployment must not restart model instances (a restarted
  # instance is retired, docs/kubernetes.md).
  - name: hams-deployment
    files:
      - deployment.yaml
generatorOptions:
  disableNameSuffixHash: true
images:
  - name: hams
    newName: hams
    newTag: latest
`),
		filepath.Join(dir, "namespace.yaml"): []byte(gen + `apiVersion: v1
kind: Namespace
metadata:
  name: hams-` + svc + `
`),
		filepath.Join(dir, "spares", "instances.yaml"): render(gen+"# The backups and standbys (phase 2: they must start after the primaries).\n", spares),
		filepath.Join(dir, "spares", "kustomization.yaml"): []byte(gen + `# ` + svc + `: the backups and standbys, applied after the serving instances
# are ready: a promoted spare's sidecar must be younger than the primary it
# replaces (its incarnation is its start time, and receivers refuse an
# older one on an edge). docs/kubernetes.md, "Apply".
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: hams-` + svc + `
labels:
  - pairs:
      app.kubernetes.io/name: hams
      app.kubernetes.io/part-of: hams
      hams.dev/deployment: ` + ex.Name + `
    includeSelectors: false
    includeTemplates: true
resources:
  - instances.yaml
images:
  - name: hams
    newName: hams
    newTag: latest
`),
	}
}

// TestOverlaysUpToDate: the committed overlays are what the generator
// makes of examples/*.yaml (a changed example or template must be
// regenerated with -update).
func TestOverlaysUpToDate(t *testing.T) {
	for _, svc := range services {
		files := generated(t, svc)
		for path, want := range files {
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, want, 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("%s: %v (run go test ./deploy/kubernetes -run TestOverlaysUpToDate -update)", path, err)
				continue
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from what examples/%s.yaml and instance.yaml.tmpl generate (run go test ./deploy/kubernetes -run TestOverlaysUpToDate -update)", path, svc)
			}
		}
	}
}

// overlayDirs are every kustomization the test renders.
func overlayDirs() []string {
	var out []string
	for _, svc := range services {
		out = append(out, filepath.Join("overlays", svc), filepath.Join("overlays", svc, "spares"))
	}
	return out
}

var _ = strings.TrimSpace
