package refserver

import (
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/hams-go/hams/internal/chunkhash"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
)

// chunkDigest is the XXH3 tree of data cut into chunks of chunk bytes,
// each chunk one range (what a WriteState of those chunks carries).
func chunkDigest(data []byte, chunk int) string {
	var parts [][]byte
	for off := 0; off < len(data); off += chunk {
		parts = append(parts, data[off:min(off+chunk, len(data))])
	}
	return chunkhash.Format(chunkhash.SumRanges(parts))
}

// sendWrite streams a WriteState: hdr, then chunks, the last sealed by
// seal.
func sendWrite(t *testing.T, e *env, hdr *hamsv1.StateChunk, chunks []*hamsv1.StateChunk, seal func(*hamsv1.StateChunk)) (*hamsv1.WriteStateResponse, error) {
	t.Helper()
	st, err := e.rt.WriteState(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(hdr); err != nil {
		return st.CloseAndRecv()
	}
	for i, c := range chunks {
		if i == len(chunks)-1 {
			c.Last = true
			seal(c)
		}
		if err := st.Send(c); err != nil {
			break
		}
	}
	return st.CloseAndRecv()
}

func chunksOf(data []byte, chunk int, base uint64) []*hamsv1.StateChunk {
	var cs []*hamsv1.StateChunk
	for off := 0; off < len(data); off += chunk {
		cs = append(cs, &hamsv1.StateChunk{Offset: base + uint64(off), Data: data[off:min(off+chunk, len(data))]})
	}
	return cs
}

// A stateful model's description offers the XXH3 write digest; WriteState
// (whole and partial) takes it instead of the SHA-256 and answers with
// its own; a digest that does not match the data, one over other chunk
// boundaries, and one of a kind the server does not take are
// InvalidArgument and change nothing.
func TestWriteStateXXH3Digest(t *testing.T) {
	e := start(t)
	ctx := ctxT(t)
	d, err := e.rt.Describe(ctx, &hamsv1.DescribeRequest{Model: "seq"})
	if err != nil || len(d.GetWriteStateDigests()) != 1 || d.GetWriteStateDigests()[0] != "xxh3" {
		t.Fatalf("describe seq: %v, %v", d.GetWriteStateDigests(), err)
	}
	if d, err := e.rt.Describe(ctx, &hamsv1.DescribeRequest{Model: "fashion"}); err != nil || len(d.GetWriteStateDigests()) != 0 {
		t.Fatalf("describe stateless fashion: %v, %v", d.GetWriteStateDigests(), err)
	}
	hdr, data, sum := readState(t, e, "seq", 0)
	for i := range data {
		data[i] ^= byte(i) // another state of the same size
	}
	whole := func() *hamsv1.StateChunk {
		return &hamsv1.StateChunk{Model: "seq", StateVersion: 7, Tensors: hdr.Tensors, TotalBytes: hdr.TotalBytes}
	}
	good := chunkDigest(data, 1000)
	for name, digest := range map[string]string{
		"mismatch":        chunkDigest(data[:len(data)-1], 1000),
		"other chunks":    chunkDigest(data, 2000),
		"unknown kind":    "md5:0123",
		"flipped in hash": chunkhash.Format(0xdead),
	} {
		_, err := sendWrite(t, e, whole(), chunksOf(data, 1000, 0), func(c *hamsv1.StateChunk) { c.Digest = digest })
		wantCode(t, name, err, codes.InvalidArgument, "digest")
	}
	if _, _, now := readState(t, e, "seq", 0); now != sum {
		t.Fatal("a refused write changed the state")
	}
	w, err := sendWrite(t, e, whole(), chunksOf(data, 1000, 0), func(c *hamsv1.StateChunk) { c.Digest = good })
	if err != nil || w.GetDigest() != good || w.GetSha256() != "" || w.GetStateVersion() != 7 {
		t.Fatalf("whole write with the xxh3 digest: %v, %v", w, err)
	}
	if _, now, _ := readState(t, e, "seq", 0); string(now) != string(data) {
		t.Fatal("state after the whole write differs from what was written")
	}

	// Partial: two ranges on version 7.
	part := &hamsv1.StateChunk{Model: "seq", StateVersion: 8, Tensors: hdr.Tensors, TotalBytes: hdr.TotalBytes, Partial: true, BaseVersion: 7}
	r1, r2 := []byte("0123456789ab"), []byte("abcdefgh") // FP32-aligned
	ranges := []*hamsv1.StateChunk{{Offset: 16, Data: r1}, {Offset: 400, Data: r2}}
	pd := chunkhash.Format(chunkhash.SumRanges([][]byte{r1, r2}))
	_, err = sendWrite(t, e, part, []*hamsv1.StateChunk{{Offset: 16, Data: r1}, {Offset: 400, Data: r2}}, func(c *hamsv1.StateChunk) { c.Digest = chunkDigest(append(append([]byte{}, r1...), r2...), 1<<20) })
	wantCode(t, "partial, ranges hashed as one", err, codes.InvalidArgument, "digest")
	w, err = sendWrite(t, e, part, ranges, func(c *hamsv1.StateChunk) { c.Digest = pd })
	if err != nil || w.GetDigest() != pd || w.GetStateVersion() != 8 {
		t.Fatalf("partial write with the xxh3 digest: %v, %v", w, err)
	}
	copy(data[16:], r1)
	copy(data[400:], r2)
	if _, now, _ := readState(t, e, "seq", 0); string(now) != string(data) {
		t.Fatal("state after the partial write differs")
	}
	// The SHA-256 still works.
	w, err = sendWrite(t, e, whole(), chunksOf(data, 1000, 0), func(c *hamsv1.StateChunk) { c.Sha256 = shaHex(data) })
	if err != nil || w.GetSha256() != shaHex(data) || w.GetDigest() != "" {
		t.Fatalf("whole write with the sha256: %v, %v", w, err)
	}
}

// A WriteState whose header names a registered region takes its data
// from there, chunk after chunk (whole and partial); an unknown region is
// NotFound, and a chunk past the region's end, data inline in a region
// write, and byte_size without a region are InvalidArgument, each
// changing nothing.
func TestWriteStateFromRegion(t *testing.T) {
	e := start(t)
	ctx := ctxT(t)
	d, err := e.rt.Describe(ctx, &hamsv1.DescribeRequest{Model: "seq"})
	if err != nil || !d.GetWriteStateRegions() {
		t.Fatalf("describe seq: regions %v, %v", d.GetWriteStateRegions(), err)
	}
	hdr, data, sum := readState(t, e, "seq", 0)
	key, reg := shmKey(t, "write", len(data))
	if _, err := e.ks.SystemSharedMemoryRegister(ctx, &inference.SystemSharedMemoryRegisterRequest{Name: "w", Key: key, ByteSize: uint64(len(data))}); err != nil {
		t.Fatal(err)
	}
	win := reg.Bytes()
	for i := range data {
		data[i] ^= byte(i) + 1
	}
	copy(win, data)
	head := func(region string, partial bool, base uint64) *hamsv1.StateChunk {
		return &hamsv1.StateChunk{Model: "seq", StateVersion: 5, Tensors: hdr.Tensors, TotalBytes: hdr.TotalBytes, Region: region, Partial: partial, BaseVersion: base}
	}
	sized := func(offs ...uint64) []*hamsv1.StateChunk {
		var cs []*hamsv1.StateChunk
		for i := 0; i+1 < len(offs); i += 2 {
			cs = append(cs, &hamsv1.StateChunk{Offset: offs[i], ByteSize: offs[i+1]})
		}
		return cs
	}
	n := uint64(len(data))
	seal := func(digest string) func(*hamsv1.StateChunk) {
		return func(c *hamsv1.StateChunk) { c.Digest = digest }
	}
	wholeDigest := chunkDigest(data, 1000)
	_, err = sendWrite(t, e, head("nowhere", false, 0), sized(0, 1000, 1000, n-1000), seal(wholeDigest))
	wantCode(t, "unknown region", err, codes.NotFound, "nowhere")
	_, err = sendWrite(t, e, head("w", false, 0), sized(0, 1000, 1000, n), seal(wholeDigest))
	wantCode(t, "past the region", err, codes.InvalidArgument, "past")
	inline := []*hamsv1.StateChunk{{Offset: 0, Data: data}}
	_, err = sendWrite(t, e, head("w", false, 0), inline, seal(chunkDigest(data, len(data))))
	wantCode(t, "data inline in a region write", err, codes.InvalidArgument, "carries")
	_, err = sendWrite(t, e, head("", false, 0), sized(0, n), seal(chunkDigest(data, len(data))))
	wantCode(t, "byte_size without a region", err, codes.InvalidArgument, "no region")
	if _, _, now := readState(t, e, "seq", 0); now != sum {
		t.Fatal("a refused write changed the state")
	}

	// Whole, in chunks of 1000 bytes.
	var whole []*hamsv1.StateChunk
	for off := uint64(0); off < n; off += 1000 {
		whole = append(whole, &hamsv1.StateChunk{Offset: off, ByteSize: min(1000, n-off)})
	}
	w, err := sendWrite(t, e, head("w", false, 0), whole, seal(wholeDigest))
	if err != nil || w.GetDigest() != wholeDigest || w.GetStateVersion() != 5 {
		t.Fatalf("whole write from the region: %v, %v", w, err)
	}
	if _, now, _ := readState(t, e, "seq", 0); string(now) != string(data) {
		t.Fatal("state after the whole write from the region differs")
	}
	// Partial: two ranges back to back at the region's start.
	copy(win, []byte("0123456789abcdefghijklmn"))
	p := head("w", true, 5)
	p.StateVersion = 6
	w, err = sendWrite(t, e, p, sized(16, 12, 400, 12), seal(chunkhash.Format(chunkhash.SumRanges([][]byte{win[:12], win[12:24]}))))
	if err != nil || w.GetStateVersion() != 6 {
		t.Fatalf("partial write from the region: %v, %v", w, err)
	}
	copy(data[16:], "0123456789ab")
	copy(data[400:], "cdefghijklmn")
	if _, now, _ := readState(t, e, "seq", 0); string(now) != string(data) {
		t.Fatal("state after the partial write from the region differs")
	}
}
