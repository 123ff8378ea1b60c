package reference

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/chunkhash"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// lastChunkConn records the first and the last chunk of every WriteState
// stream sent through it.
type lastChunkConn struct {
	grpc.ClientConnInterface
	mu          sync.Mutex
	first, last *hamsv1.StateChunk
}

func (c *lastChunkConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := c.ClientConnInterface.NewStream(ctx, desc, method, opts...)
	if err != nil || method != hamsv1.ModelRuntime_WriteState_FullMethodName {
		return s, err
	}
	return &lastChunkStream{ClientStream: s, c: c}, nil
}

func (c *lastChunkConn) lastChunk() *hamsv1.StateChunk {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

func (c *lastChunkConn) firstChunk() *hamsv1.StateChunk {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.first
}

type lastChunkStream struct {
	grpc.ClientStream
	c    *lastChunkConn
	sent int
}

func (s *lastChunkStream) SendMsg(m any) error {
	if ch, ok := m.(*hamsv1.StateChunk); ok {
		s.c.mu.Lock()
		if s.sent == 0 {
			s.c.first = proto.CloneOf(ch)
		}
		if ch.GetLast() {
			s.c.last = proto.CloneOf(ch)
		}
		s.c.mu.Unlock()
		s.sent++
	}
	return s.ClientStream.SendMsg(m)
}

// State writes carry the SHA-256 until the server's description says it
// takes the XXH3 tree, then the XXH3 tree (whole and partial writes, the
// server checking it), and the SHA-256 again once the server refuses a
// digest.
func TestWriteDigestNegotiated(t *testing.T) {
	_, cc := refBackendConn(t)
	rec := &lastChunkConn{ClientConnInterface: cc}
	b := New(rec, "seq", 0)
	ctx := context.Background()
	ts, v, err := b.ReadState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	specs := make([]*hamsv1.TensorSpec, len(ts))
	for i, x := range ts {
		specs[i] = &hamsv1.TensorSpec{Name: x.Name, Datatype: x.Datatype, Shape: x.Shape}
	}
	ranges := []*hamsv1.StateRange{{Offset: 0, Data: make([]byte, 8)}, {Offset: 64, Data: []byte{1, 2, 3, 4}}}
	wantKind := func(what string, xxh3 bool) {
		t.Helper()
		last := rec.lastChunk()
		if got := last.GetDigest() != "" && last.GetSha256() == ""; got != xxh3 || (!xxh3 && last.GetSha256() == "") {
			t.Fatalf("%s: last chunk digest %q, sha256 %q; want xxh3 %v", what, last.GetDigest(), last.GetSha256(), xxh3)
		}
		if xxh3 && !chunkhash.Is(last.GetDigest()) {
			t.Fatalf("%s: digest %q", what, last.GetDigest())
		}
	}
	if err := b.WriteStateRanges(ctx, specs, v, v+1, ranges); err != nil {
		t.Fatal(err)
	}
	wantKind("before Describe", false)
	if _, err := b.Describe(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteStateRanges(ctx, specs, v+1, v+2, ranges); err != nil {
		t.Fatal(err)
	}
	wantKind("partial, after Describe", true)
	if err := b.WriteState(ctx, ts, 40); err != nil {
		t.Fatal(err)
	}
	wantKind("whole, after Describe", true)
	got, gv, err := b.ReadState(ctx)
	if err != nil || gv != 40 || tensor.Digest(got...) != tensor.Digest(ts...) {
		t.Fatalf("state after the whole write: version %d, %v", gv, err)
	}

	// A refusal that is not about the digest keeps it; one about the
	// digest drops it.
	refused := func(msg string) {
		_ = b.writeErr(ctx, "write state", &writeSum{xxh3: &chunkhash.XXH3{}}, status.Error(codes.InvalidArgument, msg))
	}
	refused(`write state of "seq": tensor 0 is x, want y`)
	if !b.writeXXH3.Load() {
		t.Fatal("a refusal of the tensors dropped the XXH3 digest")
	}
	refused(`partial write state of "seq": sha256 "" does not match the data (e3b0)`)
	if b.writeXXH3.Load() {
		t.Fatal("a refusal of the digest kept the XXH3 digest")
	}
	if err := b.WriteStateRanges(ctx, specs, 40, 41, ranges); err != nil {
		t.Fatal(err)
	}
	wantKind("after a refused digest", false)
}
