package nspb

import (
	"sort"

	"github.com/hams-go/hams/internal/config"
)

// StatefulNeighbours computes, for every stateful model of g and for the
// frontend (config.Frontend, as the sink), its previous stateful models
// (the nearest stateful models upstream with only stateless models between)
// and for every stateful model its next stateful models (nearest downstream;
// the frontend is a next stateful model of every stateful model that reaches
// the sink through stateless models only). Lists are sorted.
func StatefulNeighbours(g *config.Graph, stateful func(model string) bool) (pfm, nfm map[string][]string) {
	pfm = map[string][]string{}
	nfm = map[string][]string{}
	nodes := append(g.Models(), config.Frontend)
	for _, n := range nodes {
		if n != config.Frontend && !stateful(n) {
			continue
		}
		// Walk upstream through stateless models.
		seen := map[string]bool{}
		var up func(m string)
		up = func(m string) {
			for _, p := range g.Pred(m) {
				if p == config.Frontend || seen[p] {
					continue
				}
				seen[p] = true
				if stateful(p) {
					pfm[n] = append(pfm[n], p)
					nfm[p] = append(nfm[p], n)
					continue
				}
				up(p)
			}
		}
		up(n)
	}
	for _, m := range []map[string][]string{pfm, nfm} {
		for k := range m {
			sort.Strings(m[k])
		}
	}
	return pfm, nfm
}
