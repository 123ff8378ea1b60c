package recovery

import (
	"fmt"
	"slices"
	"sort"

	"github.com/hams-go/hams/internal/config"
)

// Graph is the union of a deployment's service graphs as recovery needs
// it: predecessors and successors of every model (config.Frontend is the
// source and the sink) and which models are stateful.
type Graph struct {
	stateful map[string]bool
	pred     map[string][]string
	succ     map[string][]string
	models   []string
}

// NewGraph builds the graph of every service of d.
func NewGraph(d *config.Deployment) *Graph {
	st := map[string]bool{}
	for _, m := range d.Models {
		st[m.Name] = m.Stateful
	}
	var edges [][2]string
	for _, s := range d.Services {
		edges = append(edges, s.Edges...)
	}
	return NewGraphFromEdges(st, edges)
}

// NewGraphFromEdges builds a graph from [from, to] edges; stateful names the
// stateful models (absent means stateless).
func NewGraphFromEdges(stateful map[string]bool, edges [][2]string) *Graph {
	g := &Graph{stateful: map[string]bool{}, pred: map[string][]string{}, succ: map[string][]string{}}
	seen := map[string]bool{}
	for _, e := range edges {
		if !slices.Contains(g.succ[e[0]], e[1]) {
			g.succ[e[0]] = append(g.succ[e[0]], e[1])
			g.pred[e[1]] = append(g.pred[e[1]], e[0])
		}
		for _, n := range e {
			if n != config.Frontend && !seen[n] {
				seen[n] = true
				g.models = append(g.models, n)
			}
		}
	}
	for m := range seen {
		g.stateful[m] = stateful[m]
	}
	sort.Strings(g.models)
	return g
}

// Stateful reports whether model keeps state (primary + backup).
func (g *Graph) Stateful(model string) bool { return g.stateful[model] }

// Has reports whether model is in the graph.
func (g *Graph) Has(model string) bool { _, ok := g.stateful[model]; return ok }

// Pred lists the predecessors of n (may include config.Frontend).
func (g *Graph) Pred(n string) []string { return g.pred[n] }

// Succ lists the successors of n (may include config.Frontend).
func (g *Graph) Succ(n string) []string { return g.succ[n] }

// Models lists the models, sorted.
func (g *Graph) Models() []string { return g.models }

// DownstreamStateful lists every stateful model reachable from m (not m
// itself), sorted.
func (g *Graph) DownstreamStateful(m string) []string {
	seen := map[string]bool{m: true}
	var out []string
	var walk func(n string)
	walk = func(n string) {
		for _, s := range g.succ[n] {
			if s == config.Frontend || seen[s] {
				continue
			}
			seen[s] = true
			if g.stateful[s] {
				out = append(out, s)
			}
			walk(s)
		}
	}
	walk(m)
	sort.Strings(out)
	return out
}

// String is for logs and test failures.
func (g *Graph) String() string {
	return fmt.Sprintf("graph(models=%v)", g.models)
}
