package reference

import (
	"math"
	"testing"
)

// TestDeltaSizesChecked: the sizes a model server answers for a delta it
// wrote into the lent region are checked one by one against the region:
// sizes whose sum wraps around (2^64-1 then 2) used to pass the total's
// check and panic slicing the copy.
func TestDeltaSizesChecked(t *testing.T) {
	for _, c := range []struct {
		sizes []uint64
		win   uint64
		total uint64
		ok    bool
	}{
		{[]uint64{4, 8}, 16, 12, true},
		{[]uint64{16}, 16, 16, true},
		{nil, 0, 0, true},
		{[]uint64{math.MaxUint64, 2}, 16, 0, false},
		{[]uint64{8, 9}, 16, 0, false},
	} {
		total, err := deltaTotal(c.sizes, c.win)
		if (err == nil) != c.ok || total != c.total {
			t.Errorf("sizes %v in %d bytes: %d, %v", c.sizes, c.win, total, err)
		}
	}
}
