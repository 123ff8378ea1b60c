package authz

import (
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/pki"
)

// GraphFacts are the facts of a node of a deployment's service graphs (a
// model's sidecar, or the frontend with node config.Frontend): who feeds
// it. It answers no RegisteredBy (only the manager knows registrations).
type GraphFacts struct {
	feeders map[string]bool // predecessor nodes: model names, or config.Frontend
	sink    bool            // the node feeds the frontend
}

// NewGraphFacts collects the predecessors of node in every service of
// dep.
func NewGraphFacts(dep *config.Deployment, node string) *GraphFacts {
	g := &GraphFacts{feeders: map[string]bool{}}
	for i := range dep.Services {
		gr := dep.Services[i].Graph()
		for _, p := range gr.Pred(node) {
			g.feeders[p] = true
		}
		for _, s := range gr.Succ(node) {
			g.sink = g.sink || s == config.Frontend
		}
	}
	return g
}

// Feeds: a sidecar of a predecessor model, or the frontend when the node
// is an entry model.
func (g *GraphFacts) Feeds(c pki.Identity) bool {
	switch c.Role {
	case pki.RoleFrontend:
		return g.feeders[config.Frontend]
	case pki.RoleSidecar:
		if g.feeders[c.Model] {
			return true
		}
		for _, m := range c.Models {
			if g.feeders[m] {
				return true
			}
		}
	}
	return false
}

// RegisteredBy is false: a graph node serves no registrations.
func (g *GraphFacts) RegisteredBy(string, pki.Identity) bool { return false }

// Sink: the node has an edge to the frontend.
func (g *GraphFacts) Sink() bool { return g.sink }
