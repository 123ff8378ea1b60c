package models

import (
	"encoding/binary"
	"io"
	"math"
	"unsafe"
)

// littleEndian: the machine stores float32 as the wire does (IEEE 754,
// little-endian), so state bytes are the floats' memory.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// f32Chunk bounds one Write of writeF32.
const f32Chunk = 1 << 20

// writeF32 writes v little-endian in bounded chunks. The writer must not
// keep the slices it is given (io.Writer's contract).
func writeF32(w io.Writer, v []float32) error {
	if littleEndian {
		for len(v) > 0 {
			n := min(len(v), f32Chunk/4)
			if _, err := w.Write(unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*n)); err != nil {
				return err
			}
			v = v[n:]
		}
		return nil
	}
	var buf [16 << 10]byte
	for len(v) > 0 {
		n := min(len(v), len(buf)/4)
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v[i]))
		}
		if _, err := w.Write(buf[:4*n]); err != nil {
			return err
		}
		v = v[n:]
	}
	return nil
}

// readF32 fills dst from data and returns the rest.
func readF32(dst []float32, data []byte) []byte {
	if littleEndian && len(dst) > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), data[:4*len(dst)])
		return data[4*len(dst):]
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return data[4*len(dst):]
}

// encodeF32 writes v little-endian into b (len(b) >= 4*len(v)).
func encodeF32(b []byte, v []float32) {
	if littleEndian && len(v) > 0 {
		copy(b, unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v)))
		return
	}
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
}
