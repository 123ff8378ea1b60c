package models

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"sync/atomic"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/nn"
)

// lstm is a stateful LSTM (input, forget, cell, output gates) with one
// hidden/cell state per stream. Rows of one item are consecutive time
// steps of its stream; items of one stream run in item order.
//
// Streams are isolated: a stream owns a state slot of its own while it is
// live, so one client's stream never changes another's output. The
// stream table (state tensor "streams", INT32 [slots, slotWords]) names
// each slot's stream by a 128-bit SHA-256 prefix of its id (a second
// stream with the same prefix would take 2^128 tries to find) and the
// logical time of its last batch. A new stream takes its preferred slot
// (Slot) if that is free, else the next free one, else the least recently
// used slot of a stream not in the batch (LRU), whose h and c restart at
// zero; evictions are counted (StreamTable, the reference server's
// hams_refserver_stream_evictions_total). The table is part of the state,
// so a backup that installs the primary's state bytes (whole or as
// deltas) holds the same assignment, and a promoted backup continues it:
// the assignment is a function of the state and the batches, computed by
// the primary only.
type lstm struct {
	r               *nn.Reducer
	d, h, s         int
	w               []float32 // [(d+h), 4h], gate order i, f, g, o
	b               []float32 // [4h]
	hs, cs          []float32 // installed state [s,h]
	tab             []uint32  // installed stream table [s, slotWords]
	inName, outName string

	// Derived from tab (rebuilt by load, kept by install and patch):
	// the slot of each stream key, the slots in use, the newest time.
	bySlotKey map[streamKey]int
	used      int
	clock     uint64
	// evictions counts streams evicted by installed batches.
	evictions atomic.Uint64
}

// A slot of the stream table: the key's 4 words, then the time of its
// last batch (low word, high word). A free slot is all zeros.
const slotWords = 6

type streamKey [4]uint32

// keyOf is the table key of a stream id: the first 128 bits of its
// SHA-256 (never all zeros: that marks a free slot).
func keyOf(id string) streamKey {
	sum := sha256.Sum256([]byte(id))
	var k streamKey
	for i := range k {
		k[i] = binary.LittleEndian.Uint32(sum[4*i:])
	}
	if k == (streamKey{}) {
		k[0] = 1
	}
	return k
}

func (k *lstm) keyAt(sl int) streamKey {
	var key streamKey
	copy(key[:], k.tab[sl*slotWords:])
	return key
}

func (k *lstm) timeAt(sl int) uint64 {
	return uint64(k.tab[sl*slotWords+4]) | uint64(k.tab[sl*slotWords+5])<<32
}

// slotRow is a slot's table row as staged.
type slotRow [slotWords]uint32

func rowOf(key streamKey, t uint64) slotRow {
	return slotRow{key[0], key[1], key[2], key[3], uint32(t), uint32(t >> 32)}
}

// lstmStaged holds what a batch changes: the new h,c of the slots it
// touched and their table rows.
type lstmStaged struct {
	hc      map[int][2][]float32
	rows    map[int]slotRow
	evicted int
}

// Slot is a stream's preferred state slot: FNV-1a 64 of the id mod slots.
// A stream gets it unless another live stream holds it (then the next
// free slot, or the least recently used one).
func Slot(streamID string, slots int) int {
	f := fnv.New64a()
	f.Write([]byte(streamID))
	return int(f.Sum64() % uint64(slots))
}

// assign maps the batch's streams (in order of first appearance) to
// slots: a live stream keeps its slot; a new one takes a free slot or
// evicts the least recently used stream not in the batch. fresh marks the
// slots whose state restarts at zero.
func (k *lstm) assign(ids []string) (slotOf map[string]int, fresh map[int]bool, evicted int, err error) {
	slotOf = map[string]int{}
	fresh = map[int]bool{}
	taken := map[int]bool{}
	var pending []string
	for _, id := range ids {
		if _, ok := slotOf[id]; ok {
			continue
		}
		if sl, ok := k.bySlotKey[keyOf(id)]; ok {
			slotOf[id] = sl
			taken[sl] = true
			continue
		}
		slotOf[id] = -1
		pending = append(pending, id)
	}
	if len(slotOf) > k.s {
		return nil, nil, 0, fmt.Errorf("%w: a batch of %d streams, the model holds %d (param streams)", ErrInvalidInput, len(slotOf), k.s)
	}
	free := k.s - k.used
	for _, id := range pending {
		sl := -1
		if free > 0 {
			p := Slot(id, k.s)
			for i := 0; i < k.s; i++ {
				c := (p + i) % k.s
				if !taken[c] && k.keyAt(c) == (streamKey{}) {
					sl = c
					break
				}
			}
		}
		if sl >= 0 {
			free--
		} else {
			// LRU among the slots no stream of this batch holds (ties:
			// the lowest slot).
			for c := 0; c < k.s; c++ {
				if !taken[c] && (sl < 0 || k.timeAt(c) < k.timeAt(sl)) {
					sl = c
				}
			}
			evicted++
		}
		slotOf[id] = sl
		taken[sl] = true
		fresh[sl] = true
	}
	return slotOf, fresh, evicted, nil
}

func (k *lstm) compute(in *inputs) ([]*hamsv1.Tensor, any, error) {
	x := in.float(k.inName)
	streams := in.streamOfRow()
	slotOf, fresh, evicted, err := k.assign(streams)
	if err != nil {
		return nil, nil, err
	}
	slot := make([]int, in.n)
	step := make([]int, in.n)
	seen := map[int]int{}
	waves := 0
	for r, id := range streams {
		slot[r] = slotOf[id]
		step[r] = seen[slot[r]]
		seen[slot[r]]++
		waves = max(waves, step[r]+1)
	}
	staged := &lstmStaged{hc: map[int][2][]float32{}, rows: map[int]slotRow{}, evicted: evicted}
	zero := make([]float32, k.h)
	cur := func(sl int) ([]float32, []float32) {
		if st, ok := staged.hc[sl]; ok {
			return st[0], st[1]
		}
		if fresh[sl] {
			return zero, zero
		}
		return k.hs[sl*k.h : (sl+1)*k.h], k.cs[sl*k.h : (sl+1)*k.h]
	}
	y := make([]float32, in.n*k.h)
	dh := k.d + k.h
	for wv := 0; wv < waves; wv++ {
		var rows []int
		for r := range streams {
			if step[r] == wv {
				rows = append(rows, r)
			}
		}
		nw := len(rows)
		xin := make([]float32, nw*dh)
		for i, r := range rows {
			copy(xin[i*dh:], x[r*k.d:(r+1)*k.d])
			hp, _ := cur(slot[r])
			copy(xin[i*dh+k.d:], hp)
		}
		gates := make([]float32, nw*4*k.h)
		k.r.MatMul(gates, xin, k.w, nw, dh, 4*k.h)
		nn.AddBias(gates, k.b, nw, 4*k.h)
		for i, r := range rows {
			g := gates[i*4*k.h : (i+1)*4*k.h]
			_, cp := cur(slot[r])
			hn, cn := make([]float32, k.h), make([]float32, k.h)
			for j := 0; j < k.h; j++ {
				ig := nn.Sigmoid(g[j])
				fg := nn.Sigmoid(g[k.h+j])
				gg := float32(math.Tanh(float64(g[2*k.h+j])))
				og := nn.Sigmoid(g[3*k.h+j])
				cn[j] = fg*cp[j] + ig*gg
				hn[j] = og * float32(math.Tanh(float64(cn[j])))
			}
			staged.hc[slot[r]] = [2][]float32{hn, cn}
			copy(y[r*k.h:], hn)
		}
	}
	now := k.clock + 1
	for id, sl := range slotOf {
		staged.rows[sl] = rowOf(keyOf(id), now)
	}
	return []*hamsv1.Tensor{out32(k.outName, in.n, k.h, y)}, staged, nil
}

func (k *lstm) install(staged any) {
	st := staged.(*lstmStaged)
	for sl, hc := range st.hc {
		copy(k.hs[sl*k.h:(sl+1)*k.h], hc[0])
		copy(k.cs[sl*k.h:(sl+1)*k.h], hc[1])
	}
	for sl, row := range st.rows {
		k.setRow(sl, row)
	}
	k.evictions.Add(uint64(st.evicted))
}

// setRow writes a slot's table row and keeps the derived fields.
func (k *lstm) setRow(sl int, row slotRow) {
	old := k.keyAt(sl)
	copy(k.tab[sl*slotWords:], row[:])
	k.rekey(sl, old)
}

// rekey updates the derived fields after slot sl's row changed from key
// old. Two slots naming one key (only a state written from outside can)
// resolve to the lower slot.
func (k *lstm) rekey(sl int, old streamKey) {
	key := k.keyAt(sl)
	if old != (streamKey{}) {
		if k.bySlotKey[old] == sl {
			delete(k.bySlotKey, old)
		}
		k.used--
	}
	if key != (streamKey{}) {
		if prev, ok := k.bySlotKey[key]; !ok || sl < prev {
			k.bySlotKey[key] = sl
		}
		k.used++
	}
	k.clock = max(k.clock, k.timeAt(sl))
}

// reindex rebuilds the derived fields from the table.
func (k *lstm) reindex() {
	k.bySlotKey = make(map[streamKey]int, k.s)
	k.used, k.clock = 0, 0
	for sl := 0; sl < k.s; sl++ {
		k.rekey(sl, streamKey{})
	}
}

func (k *lstm) stateSpecs() []*hamsv1.TensorSpec {
	return []*hamsv1.TensorSpec{stateSpec("h", int64(k.s), int64(k.h)), stateSpec("c", int64(k.s), int64(k.h)),
		{Name: "streams", Datatype: "INT32", Shape: []int64{int64(k.s), slotWords}}}
}

func (k *lstm) writeTo(w io.Writer) error {
	if err := writeF32(w, k.hs); err != nil {
		return err
	}
	if err := writeF32(w, k.cs); err != nil {
		return err
	}
	_, err := w.Write(u32Bytes(k.tab))
	return err
}

// capture copies h, c and the table (install writes them in place); they
// are small: streams x hidden floats each.
func (k *lstm) capture() func(io.Writer) error {
	hs, cs, tab := append([]float32(nil), k.hs...), append([]float32(nil), k.cs...), u32Bytes(k.tab)
	return func(w io.Writer) error {
		if err := writeF32(w, hs); err != nil {
			return err
		}
		if err := writeF32(w, cs); err != nil {
			return err
		}
		_, err := w.Write(tab)
		return err
	}
}

func (k *lstm) load(data []byte) error {
	rest := readF32(k.hs, data)
	rest = readF32(k.cs, rest)
	for i := range k.tab {
		k.tab[i] = binary.LittleEndian.Uint32(rest[4*i:])
	}
	k.reindex()
	return nil
}

// u32Bytes is the little-endian encoding of v.
func u32Bytes(v []uint32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
	return b
}

// StreamSlotOf finds stream id's slot in the bytes of an lstm's stream
// table (state tensor "streams"); ok is false when it holds none.
func StreamSlotOf(table []byte, id string) (slot int, ok bool) {
	key := keyOf(id)
	for sl := 0; (sl+1)*4*slotWords <= len(table); sl++ {
		row := table[sl*4*slotWords:]
		match := true
		for i, w := range key {
			if binary.LittleEndian.Uint32(row[4*i:]) != w {
				match = false
				break
			}
		}
		if match {
			return sl, true
		}
	}
	return 0, false
}

// StreamTable reports the stream table of a per-stream model: the slots
// live streams hold, the slots in all, and the streams evicted so far (by
// this process's batches). ok is false for other models.
func StreamTable(m Model) (live, slots int, evictions uint64, ok bool) {
	var k *lstm
	switch c := m.(type) {
	case *core:
		k, ok = c.k.(*lstm)
		if ok {
			c.stMu.RLock()
			defer c.stMu.RUnlock()
		}
	case *explicitModel:
		k, ok = c.c.k.(*lstm)
		if ok {
			c.mu.Lock()
			defer c.mu.Unlock()
		}
	}
	if !ok {
		return 0, 0, 0, false
	}
	return k.used, k.s, k.evictions.Load(), true
}

func init() {
	// lstm (stateful): x FP32 [N,in_dim] -> y FP32 [N,hidden], the new
	// hidden state of the row's stream. State: h [streams,hidden], c
	// [streams,hidden] (FP32) and the stream table streams [streams, 6]
	// (INT32): one slot per live stream, LRU eviction beyond `streams`
	// live streams. Params: in_dim 64, hidden 64, streams 64, seed 3.
	register("lstm", func(m *config.Model, p *params) (*core, error) {
		d, h, s := p.int("in_dim", 64, 1, 1<<16), p.int("hidden", 64, 1, 1<<14), p.int("streams", 64, 1, 1<<20)
		seed := p.int("seed", 3, 0, math.MaxInt32)
		inName, outName := names(p, "x", "y")
		if p.err != nil {
			return nil, p.err
		}
		rng := nn.NewRand(uint64(seed))
		k := &lstm{r: p.reducer(), d: d, h: h, s: s, w: make([]float32, (d+h)*4*h), b: make([]float32, 4*h),
			hs: make([]float32, s*h), cs: make([]float32, s*h), tab: make([]uint32, s*slotWords), inName: inName, outName: outName}
		k.reindex()
		nn.FillNormal(k.w, nn.Glorot(d+h, h), rng)
		for j := h; j < 2*h; j++ {
			k.b[j] = 1 // forget-gate bias
		}
		return &core{ins: []inputSpec{{spec: fp32Spec(inName, int64(d))}}, outs: []*hamsv1.TensorSpec{fp32Spec(outName, int64(h))}, k: k, sk: k}, nil
	})
}
