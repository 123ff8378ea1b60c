package refserver

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/wire"
)

type testRegion struct {
	pins
	size   uint64
	closed int
}

func (r *testRegion) pinsOf() *pins { return &r.pins }
func (r *testRegion) closeRegion()  { r.closed++ }

// A region unregistered while a request uses it is closed when that
// request ends, once; one nobody uses is closed at once. Windows outside
// the region and unknown regions are refused without pinning.
func TestRegionPinsDeferClose(t *testing.T) {
	a, b := &testRegion{size: 16}, &testRegion{size: 16}
	regions := map[string]*testRegion{"a": a, "b": b}
	size := func(r *testRegion) uint64 { return r.size }
	r, off, n, err := pinWindow(regions, size, "x", wire.ShmParams("a", 4, 8))
	if err != nil || r != a || off != 4 || n != 8 || a.refs != 1 {
		t.Fatalf("pin a: %v %d %d %v refs %d", r, off, n, err, a.refs)
	}
	for _, c := range []struct {
		region    string
		off, size int64
		want      codes.Code
	}{{"a", 16, 1, codes.InvalidArgument}, {"a", 8, 9, codes.InvalidArgument}, {"zz", 0, 1, codes.NotFound}} {
		if _, _, _, err := pinWindow(regions, size, "x", wire.ShmParams(c.region, c.off, c.size)); status.Code(err) != c.want {
			t.Fatalf("window %s %d+%d: %v, want %v", c.region, c.off, c.size, err, c.want)
		}
	}
	if a.refs != 1 {
		t.Fatalf("refused windows pinned a: refs %d", a.refs)
	}
	unregisterRegions(regions, "")
	if len(regions) != 0 || a.closed != 0 || b.closed != 1 {
		t.Fatalf("after unregistering all: %d left, a closed %d (in use), b closed %d", len(regions), a.closed, b.closed)
	}
	unpin(a)
	if a.closed != 1 {
		t.Fatalf("a closed %d times after its last use ended, want 1", a.closed)
	}
	if got := regionNames(map[string]int{"b": 1, "a": 2}); len(got) != 2 || got[0] != "a" {
		t.Fatalf("names %v", got)
	}
}
