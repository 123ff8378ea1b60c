package models

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Do sparse or compressed deltas pay for the online learners (issue 22)?
// go test ./refserver/models -run '^$' -bench LearnerDelta -benchtime 3x -count 3
//
// The learner of the paper's olv (64 MiB, expert_width 1024) and olm
// (16 MiB, 512) takes SGD steps on batches of 16 labelled z-scored rows,
// as the paper configuration's prep hands them; for the delta of the
// last batch it reports:
//   - dirty-pages, dirty-floats: the fraction of the delta's 4 KiB pages
//     and floats that differ from the state before (what a page- or
//     row-granular sparse delta would still ship);
//   - per compressor (zstd at its fastest level, s2: Snappy/LZ4-class),
//     of the delta as shipped (raw) and of its XOR with the bytes it
//     replaces (xor, which zeroes the unchanged high bits of small
//     steps): ratio (compressed/raw) and ms of CPU to compress a MB, with
//     memcpy-ms/MB (a copy of the same bytes) for scale.
//
// A compressor lowers the primary's CPU per replicated MB only if its
// cost per MB is below what the bytes it removes would cost on the wire
// (about one copy into the kernel per MB, plus the TCP stack: ~1-1.5x
// memcpy on loopback, BenchmarkShipDelta in sidecar), and the backup
// then pays the decompression on top.
func BenchmarkLearnerDelta(b *testing.B) {
	for _, c := range []struct {
		name      string
		mb, width int
	}{{"olv", 64, 1024}, {"olm", 16, 512}} {
		b.Run(c.name, func(b *testing.B) {
			m := mk(b, "olearn", map[string]any{"in_dim": 784, "classes": 10, "state_mb": c.mb, "expert_width": c.width, "seed": 51})
			const rows = 16
			var delta []Range
			before := stateBytes(b, m)
			for i := uint64(1); i <= 3; i++ {
				before = stateBytes(b, m)
				x := randT("x", rows, 784, i)
				labels := make([]int64, rows)
				for j := range labels {
					labels[j] = int64((int(i)*7 + j) % 10)
				}
				lab := tensor.FromInt64("labels", []int64{rows}, labels)
				res, err := m.Compute(&Batch{Inputs: []*hamsv1.Tensor{x, lab}, Rows: []uint32{rows}, BatchID: i, StageDelta: true})
				if err != nil {
					b.Fatal(err)
				}
				delta = res.Delta
				if _, err := m.Update(i); err != nil {
					b.Fatal(err)
				}
			}
			var raw, xor []byte
			var pages, dirtyPages, floats, dirtyFloats int
			for _, r := range delta {
				raw = append(raw, r.Data...)
				old := before[r.Off : r.Off+uint64(len(r.Data))]
				for p := 0; p < len(r.Data); p += 4096 {
					e := min(p+4096, len(r.Data))
					pages++
					if string(old[p:e]) != string(r.Data[p:e]) {
						dirtyPages++
					}
				}
				for j := 0; j+4 <= len(r.Data); j += 4 {
					floats++
					o, n := binary.LittleEndian.Uint32(old[j:]), binary.LittleEndian.Uint32(r.Data[j:])
					if o != n {
						dirtyFloats++
					}
					xor = binary.LittleEndian.AppendUint32(xor, o^n)
				}
			}
			mb := float64(len(raw)) / 1e6
			dst := make([]byte, len(raw))
			enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
			if err != nil {
				b.Fatal(err)
			}
			defer enc.Close()
			s2buf := make([]byte, s2.MaxEncodedLen(len(raw)))
			zbuf := make([]byte, 0, len(raw)+len(raw)/8)
			var tCopy, tZraw, tZxor, tSraw, tSxor time.Duration
			var zr, zx, sr, sx int
			timeIt := func(d *time.Duration, f func()) {
				t0 := time.Now()
				f()
				*d += time.Since(t0)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				timeIt(&tCopy, func() { copy(dst, raw) })
				timeIt(&tZraw, func() { zr = len(enc.EncodeAll(raw, zbuf[:0])) })
				timeIt(&tZxor, func() { zx = len(enc.EncodeAll(xor, zbuf[:0])) })
				timeIt(&tSraw, func() { sr = len(s2.Encode(s2buf, raw)) })
				timeIt(&tSxor, func() { sx = len(s2.Encode(s2buf, xor)) })
			}
			b.StopTimer()
			per := func(d time.Duration) float64 { return d.Seconds() * 1e3 / (float64(b.N) * mb) }
			b.ReportMetric(per(tCopy), "memcpy-ms/MB")
			b.ReportMetric(float64(len(raw))/1e6, "delta-MB")
			b.ReportMetric(float64(dirtyPages)/float64(pages), "dirty-pages")
			b.ReportMetric(float64(dirtyFloats)/float64(floats), "dirty-floats")
			for _, r := range []struct {
				name string
				t    time.Duration
				n    int
			}{{"zstd-raw", tZraw, zr}, {"zstd-xor", tZxor, zx}, {"s2-raw", tSraw, sr}, {"s2-xor", tSxor, sx}} {
				b.ReportMetric(float64(r.n)/float64(len(raw)), r.name+"-ratio")
				b.ReportMetric(per(r.t), r.name+"-ms/MB")
			}
		})
	}
}
