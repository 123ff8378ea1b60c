package integration

import (
	"testing"

	"github.com/hams-go/hams/internal/netfault"
)

// hams chaos with faults that are not clean kills (issue 18 item 7):
// freezes and partitions of drawn processes for half to three suspicion
// timeouts, some of them falsely suspected; every fault recovered, no
// conflict, nothing lost (runChaos checks the report).
func TestChaosFreezes(t *testing.T) {
	c := runChaos(t, "ap", "primary,backup,stateless,freeze", "10s", "7", 3)
	faults := 0
	for _, k := range c.Kills {
		if k.Fault == "freeze" {
			faults++
			if k.DurationMs <= 0 {
				t.Fatalf("freeze without a duration: %+v", k)
			}
		}
	}
	if faults == 0 {
		t.Fatalf("no freeze among %d kills", len(c.Kills))
	}
}

func TestChaosPartitions(t *testing.T) {
	if err := netfault.Supported(); err != nil {
		t.Skipf("partitions need root, net_cls and iptables: %v", err)
	}
	c := runChaos(t, "ap", "primary,stateless,frontend,partition", "10s", "11", 3)
	faults := 0
	for _, k := range c.Kills {
		if k.Fault == "partition" {
			faults++
		}
	}
	if faults == 0 {
		t.Fatalf("no partition among %d kills", len(c.Kills))
	}
}
