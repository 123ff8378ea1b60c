package manager

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// FuzzTopologyRecord reads an arbitrary value of the topology key (anyone
// who can write the bucket can put one there): no panic; an error wraps
// ErrBadTopology; a topology read encodes (encodeTopology, what the
// manager writes) to a value that reads the same (decode(encode(x)) ==
// x), and the encoding is deterministic.
func FuzzTopologyRecord(f *testing.F) {
	t0 := &hamsv1.Topology{Deployment: "d", Mode: "nspb", Frontends: []string{"127.0.0.1:1"},
		Placements: []*hamsv1.Placement{{ComponentId: "sidecar/a/primary", Model: "a", SidecarAddress: "127.0.0.1:2", Epoch: 3, Alive: true}}}
	b, _ := encodeTopology(t0)
	f.Add(b)
	f.Add([]byte("\x0a\xff\xff\xff\xff\x0fgarbage!"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		tp, err := decodeTopology(b, 9)
		if err != nil {
			if !errors.Is(err, ErrBadTopology) {
				t.Fatalf("error %v does not wrap ErrBadTopology", err)
			}
			return
		}
		if tp.GetRevision() != 9 {
			t.Fatalf("revision %d, want the entry's 9", tp.GetRevision())
		}
		enc, err := encodeTopology(tp)
		if err != nil {
			t.Fatalf("encode a decoded topology: %v", err)
		}
		back, err := decodeTopology(enc, 9)
		if err != nil || !proto.Equal(back, tp) {
			t.Fatalf("decode(encode(x)) = %v %v, want %v", back, err, tp)
		}
		if again, _ := encodeTopology(back); string(again) != string(enc) {
			t.Fatal("encoding is not deterministic")
		}
	})
}
