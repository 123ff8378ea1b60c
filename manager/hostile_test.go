package manager

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// TestStoreRewritesUnreadableTopology: garbage on the topology key (14
// bytes, as an attacker with write access to NATS put there) no longer
// leaves the manager unable to write its state: the next write applies
// its change to the last readable topology and replaces the garbage;
// a store that starts on garbage starts from its initial topology.
func TestStoreRewritesUnreadableTopology(t *testing.T) {
	s, met := newTestStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.ensure(ctx, &hamsv1.Topology{Deployment: "cas test"}); err != nil {
		t.Fatal(err)
	}
	addFrontend := func(a string) func(*hamsv1.Topology) {
		return func(t *hamsv1.Topology) {
			for _, f := range t.Frontends {
				if f == a {
					return
				}
			}
			t.Frontends = append(t.Frontends, a)
		}
	}
	if _, err := s.mutate(ctx, addFrontend("fe-1")); err != nil {
		t.Fatal(err)
	}
	garbage := []byte("\x0a\xff\xff\xff\xff\x0fgarbage!")
	if _, err := s.kv.Put(ctx, TopologyKey, garbage); err != nil {
		t.Fatal(err)
	}
	got, err := s.mutate(ctx, addFrontend("fe-2"))
	if err != nil {
		t.Fatalf("write over an unreadable topology: %v", err)
	}
	if strings.Join(got.GetFrontends(), ",") != "fe-1,fe-2" || got.GetDeployment() != "cas test" {
		t.Fatalf("written %v", got)
	}
	e, err := s.kv.Get(ctx, TopologyKey)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := DecodeTopology(e)
	if err != nil || !proto.Equal(stored, got) {
		t.Fatalf("stored %v %v, want %v", stored, err, got)
	}
	if n := counterValue(t, met.kvUnreadable); n != 1 {
		t.Fatalf("unreadable reads %v, want 1", n)
	}
	// A store that starts on garbage: its initial topology.
	if _, err := s.kv.Put(ctx, TopologyKey, garbage); err != nil {
		t.Fatal(err)
	}
	s2 := &store{kv: s.kv, metrics: met}
	t0, err := s2.ensure(ctx, &hamsv1.Topology{Deployment: "cas test", Mode: "nspb"})
	if err != nil || t0.GetMode() != "nspb" {
		t.Fatalf("ensure on garbage: %v %v", t0, err)
	}
	if got, err := s2.mutate(ctx, addFrontend("fe-3")); err != nil || strings.Join(got.GetFrontends(), ",") != "fe-3" || got.GetMode() != "nspb" {
		t.Fatalf("first write of a store started on garbage: %v %v", got, err)
	}
}

// TestDecodeTopologyBounds: a value over MaxTopologyBytes is refused
// before it is decoded; garbage is ErrBadTopology.
func TestDecodeTopologyBounds(t *testing.T) {
	if _, err := decodeTopology(make([]byte, MaxTopologyBytes+1), 3); !errors.Is(err, ErrBadTopology) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("oversized: %v", err)
	}
	if _, err := decodeTopology([]byte{0x0a, 0x7f}, 3); !errors.Is(err, ErrBadTopology) || !strings.Contains(err.Error(), "revision 3") {
		t.Fatalf("garbage: %v", err)
	}
	tp, err := decodeTopology(nil, 4)
	if err != nil || tp.GetRevision() != 4 {
		t.Fatalf("empty: %v %v", tp, err)
	}
}
