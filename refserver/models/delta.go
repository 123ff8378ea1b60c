package models

import (
	"encoding/binary"
	"fmt"
	"sort"
	"unsafe"
)

// Range is data at a byte offset of a model's concatenated state (the
// layout of ReadState: the state tensors in order, FP32 little-endian).
type Range struct {
	Off  uint64
	Data []byte
}

// deltaKernel is a stateKernel that describes a staged state as the byte
// ranges its install writes, and patches ranges into the installed state.
// With it the compute of batch n hands the caller the exact difference
// between state n-1 and state n, so a replica can follow without the
// whole state being read and copied after every batch.
type deltaKernel interface {
	// delta returns the ranges install(staged) will write, in increasing,
	// non-overlapping order (state lock held shared; staged not installed).
	delta(staged any) []Range
	// patch writes ranges into the installed state (state lock held
	// exclusively); every range lies inside the state, and its offset
	// and length are multiples of 4. It never writes into memory that a
	// capture may still be reading.
	patch(ranges []Range) error
}

// f32Bytes is the little-endian encoding of v.
func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	encodeF32(b, v)
	return b
}

// f32View is f32Bytes without the copy where the machine is
// little-endian: v's own memory. Only for floats that are never written
// again (olearn's staged blocks: compute builds new ones, patch copies a
// block before writing it); an olv delta is ~20 MB per batch that would
// otherwise be allocated, zeroed and copied on the serving CPU.
func f32View(v []float32) []byte {
	if nativeLittleEndian && len(v) > 0 {
		return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
	}
	return f32Bytes(v)
}

var nativeLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// floatSpans maps a state range onto the float slices of the state laid
// end to end (sizes in floats): fn gets the part index, the element
// offset in it and the range's bytes that fall there.
func floatSpans(sizes []int, r Range, fn func(part, elem int, data []byte)) {
	i := int(r.Off / 4)
	data := r.Data
	for p, n := range sizes {
		if len(data) == 0 {
			return
		}
		if i >= n {
			i -= n
			continue
		}
		k := min(len(data)/4, n-i)
		fn(p, i, data[:4*k])
		data = data[4*k:]
		i = 0
	}
}

// lstm: the rows of h, c and the stream table of every slot the batch
// touched.
func (k *lstm) delta(staged any) []Range {
	st := staged.(*lstmStaged)
	slots := make([]int, 0, len(st.rows))
	for sl := range st.rows {
		slots = append(slots, sl)
	}
	sort.Ints(slots)
	out := make([]Range, 0, 3*len(slots))
	row := uint64(4 * k.h)
	for part := 0; part < 2; part++ {
		base := uint64(part) * uint64(k.s) * row
		for _, sl := range slots {
			out = append(out, Range{Off: base + uint64(sl)*row, Data: f32Bytes(st.hc[sl][part])})
		}
	}
	base := 2 * uint64(k.s) * row
	for _, sl := range slots {
		r := st.rows[sl]
		out = append(out, Range{Off: base + uint64(sl)*4*slotWords, Data: u32Bytes(r[:])})
	}
	return out
}

// patch writes in place (capture copies h, c and the table) and keeps
// the table's derived fields.
func (k *lstm) patch(ranges []Range) error {
	parts := [][]float32{k.hs, k.cs}
	sizes := []int{len(k.hs), len(k.cs), len(k.tab)}
	old := map[int]streamKey{}
	for _, r := range ranges {
		floatSpans(sizes, r, func(p, i int, data []byte) {
			if p < 2 {
				readF32(parts[p][i:i+len(data)/4], data)
				return
			}
			for sl := i / slotWords; sl <= (i+len(data)/4-1)/slotWords; sl++ {
				if _, ok := old[sl]; !ok {
					old[sl] = k.keyAt(sl)
				}
			}
			for j := 0; j < len(data)/4; j++ {
				k.tab[i+j] = binary.LittleEndian.Uint32(data[4*j:])
			}
		})
	}
	slots := make([]int, 0, len(old))
	for sl := range old {
		slots = append(slots, sl)
	}
	sort.Ints(slots) // deterministic resolution of duplicate keys
	for _, sl := range slots {
		k.rekey(sl, old[sl])
	}
	return nil
}

// olearn: the four parts of every block the batch's labelled rows touched.
func (k *olearn) delta(staged any) []Range {
	st := staged.(map[int]*expert)
	blocks := make([]int, 0, len(st))
	for e := range st {
		blocks = append(blocks, e)
	}
	sort.Ints(blocks)
	out := make([]Range, 0, 4*len(blocks))
	var base uint64
	for _, part := range k.parts() {
		per := uint64(4 * len(part(k.experts[0])))
		for _, e := range blocks {
			out = append(out, Range{Off: base + uint64(e)*per, Data: f32View(part(st[e]))})
		}
		base += uint64(k.e) * per
	}
	return out
}

// patch never writes an installed block in place (captures hold block
// pointers): a block it writes gets a new expert, and each part of it a
// new slice, copied from the old one only when the ranges do not cover
// the part whole (a delta ships whole blocks: copying a part that is
// overwritten next was one copy per replicated byte for nothing on the
// backup's model server, issue 22).
func (k *olearn) patch(ranges []Range) error {
	k.ready()
	parts := k.parts()
	per := make([]int, len(parts))
	sizes := make([]int, len(parts))
	for p, part := range parts {
		per[p] = len(part(k.experts[0]))
		sizes[p] = per[p] * k.e
	}
	fresh := map[int]*[4]bool{} // block -> parts already new
	for _, r := range ranges {
		var err error
		floatSpans(sizes, r, func(p, i int, data []byte) {
			for len(data) > 0 {
				e, j := i/per[p], i%per[p]
				if e >= k.e {
					err = fmt.Errorf("range at %d past the state", r.Off)
					return
				}
				f := fresh[e]
				if f == nil {
					x := *k.experts[e] // a new block sharing the parts until written
					k.experts[e], f = &x, new([4]bool)
					fresh[e] = f
				}
				n := min(len(data)/4, per[p]-j)
				dst := partRef(k.experts[e], p)
				if !f[p] {
					if j == 0 && n == per[p] {
						*dst = make([]float32, per[p]) // written whole just below
					} else {
						*dst = append([]float32(nil), *dst...)
					}
					f[p] = true
				}
				readF32((*dst)[j:j+n], data[:4*n])
				data, i = data[4*n:], i+n
			}
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// partRef is part p of x in parts' order (w1, b1, w2, b2).
func partRef(x *expert, p int) *[]float32 {
	switch p {
	case 0:
		return &x.w1
	case 1:
		return &x.b1
	case 2:
		return &x.w2
	default:
		return &x.b2
	}
}
