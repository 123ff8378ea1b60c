package manager

import (
	"slices"
	"testing"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// chainYAML is frontend -> a (stateless) -> b (stateful, replicated) ->
// frontend, the default mode (nspb): the internal tests' deployment.
const chainYAML = `
name: test
models:
  - name: a
    kind: prep
  - name: b
    kind: lstm
    stateful: true
    placement: {primary: h1, backup: h2}
services:
  - name: s
    edges: [[frontend, a], [a, b], [b, frontend]]
`

func place(id, model string, role hamsv1.Role, alive bool) *hamsv1.Placement {
	return &hamsv1.Placement{ComponentId: id, Model: model, Role: role, Alive: alive, SidecarAddress: "127.0.0.1:1", BackendAddress: "127.0.0.1:2"}
}

func TestUnfinishedRecovery(t *testing.T) {
	dep, err := config.Parse([]byte(chainYAML))
	if err != nil {
		t.Fatal(err)
	}
	if !dep.HasStandby("a") || !dep.Replicated(dep.Model("b")) {
		t.Fatalf("the test deployment must give a a standby and replicate b")
	}
	const (
		P = hamsv1.Role_ROLE_PRIMARY
		B = hamsv1.Role_ROLE_BACKUP
		S = hamsv1.Role_ROLE_STANDBY
		A = hamsv1.Role_ROLE_ACTIVE
	)
	whole := []*hamsv1.Placement{
		place("a/active", "a", A, true), place("a/standby", "a", S, true),
		place("b/primary", "b", P, true), place("b/backup", "b", B, true), place("b/spare", "b", S, true),
	}
	for _, c := range []struct {
		name string
		edit func([]*hamsv1.Placement) []*hamsv1.Placement
		want []string
	}{
		{"whole", func(p []*hamsv1.Placement) []*hamsv1.Placement { return p }, nil},
		{"recovered: dead ones beside live replacements", func(p []*hamsv1.Placement) []*hamsv1.Placement {
			return append(p, place("a/standby-old", "a", S, false), place("b/old-primary", "b", B, false), place("b/spare-old", "b", S, false))
		}, nil},
		{"standbys retired, none started", func(p []*hamsv1.Placement) []*hamsv1.Placement {
			p[1].Alive, p[4].Alive = false, false
			return p
		}, []string{"a/standby", "b/spare"}},
		{"failover not finished", func(p []*hamsv1.Placement) []*hamsv1.Placement {
			p[2].Alive = false
			return p
		}, []string{"b/primary"}},
		{"failover done, no new backup yet", func(p []*hamsv1.Placement) []*hamsv1.Placement {
			p[2].Role, p[2].Alive = B, false // the old primary, demoted in the topology
			p[3].Role = P                    // the promoted backup
			return p
		}, []string{"b/primary"}},
		{"stateless active lost", func(p []*hamsv1.Placement) []*hamsv1.Placement {
			p[0].Alive = false
			return p
		}, []string{"a/active"}},
		{"model servers hold no role", func(p []*hamsv1.Placement) []*hamsv1.Placement {
			return append(p, &hamsv1.Placement{ComponentId: "modelserver/a", Model: "a", BackendAddress: "x"})
		}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var ps []*hamsv1.Placement
			for _, p := range whole {
				ps = append(ps, place(p.ComponentId, p.Model, p.Role, p.Alive))
			}
			got := unfinishedRecovery(&hamsv1.Topology{Placements: c.edit(ps)}, dep)
			var ids []string
			for _, u := range got {
				ids = append(ids, u.id)
			}
			slices.Sort(ids)
			if !slices.Equal(ids, c.want) {
				t.Fatalf("suspected again %v, want %v", ids, c.want)
			}
		})
	}
}
