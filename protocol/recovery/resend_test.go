package recovery

import (
	"fmt"
	"slices"
	"sort"
	"testing"

	"github.com/hams-go/hams/internal/config"
)

// A stateless join before a recovered stateful model needs every branch
// again: two branches that start at the frontend get a resend each (the
// frontend was once counted only for the first branch walked).
func TestResendPlanEveryBranchOfAJoin(t *testing.T) {
	// sp's shape: frontend -> s (stateful), p, q (stateless) -> j (stateless
	// join) -> t (stateful) -> frontend; plus a diamond p -> r -> j.
	g := NewGraphFromEdges(map[string]bool{"s": true, "t": true}, [][2]string{
		{config.Frontend, "s"}, {config.Frontend, "p"}, {config.Frontend, "q"},
		{"s", "j"}, {"p", "j"}, {"q", "j"}, {"p", "r"}, {"r", "j"}, {"j", "t"}, {"t", config.Frontend},
	})
	after, keys := resendPlan(g, []string{"s", "t"}, map[string]map[string]uint64{
		"s": {config.Frontend: 40},
		"t": {"s": 30, config.Frontend: 35},
	})
	var got []string
	for _, k := range keys {
		got = append(got, fmt.Sprintf("%s->%s>%d", k.from, k.to, after[k]))
	}
	sort.Strings(got)
	want := []string{"frontend->p>35", "frontend->q>35", "frontend->s>40", "s->j>30"}
	if !slices.Equal(got, want) {
		t.Fatalf("resends %v, want %v", got, want)
	}
}
