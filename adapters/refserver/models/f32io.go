package models

import (
	"encoding/binary"
	"io"
	"math"
)

// writeF32 writes v little-endian in bounded chunks.
func writeF32(w io.Writer, v []float32) error {
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
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return data[4*len(dst):]
}
