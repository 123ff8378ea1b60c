package parity

import (
	"fmt"
	"math"
	"strings"
)

// EncoderKind names an encoder design.
type EncoderKind int

// Encoder kinds. The zero value is not a valid kind, so a forgotten field
// in a configuration does not silently pick one.
const (
	// EncoderSum: parity query j = sum_i c(j,i)·X_i (NewSumEncoder).
	EncoderSum EncoderKind = iota + 1
	// EncoderConcat: downsample and tile k images (NewConcatEncoder).
	EncoderConcat
)

// String is the name ParseEncoder accepts: "sum" or "concat".
func (k EncoderKind) String() string {
	switch k {
	case EncoderSum:
		return "sum"
	case EncoderConcat:
		return "concat"
	}
	return fmt.Sprintf("EncoderKind(%d)", int(k))
}

// ParseEncoder maps "sum" or "concat" (case-insensitive) to its kind; any
// other name is an ErrUnknownEncoder error naming it and the valid names.
func ParseEncoder(s string) (EncoderKind, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "sum":
		return EncoderSum, nil
	case "concat":
		return EncoderConcat, nil
	}
	return 0, fmt.Errorf("%w %q: valid encoders are %q and %q", ErrUnknownEncoder, s, EncoderSum.String(), EncoderConcat.String())
}

// Encoder builds the parity queries of a coding group.
type Encoder interface {
	// Encode writes parity query j of a group into dst. queries[i] is query i of the group
	// (len == QuerySize()), or nil when that batch has no such row (a short batch: padding,
	// treated as a zero query). Zero allocations.
	//
	// len(dst) must be QuerySize() and len(queries) the code's K (else
	// ErrShape); 0 <= j < R (else ErrBadCode). dst must not overlap a query.
	Encode(dst []float32, queries [][]float32, j int) error
	// QuerySize is the number of float32 values of one query (and of one
	// parity query).
	QuerySize() int
	// Kind is the encoder's design.
	Kind() EncoderKind
}

// checkEncodeArgs validates the arguments every Encode shares.
func checkEncodeArgs(code Code, size int, dst []float32, queries [][]float32, j int) error {
	if err := code.checkParityIndex(j); err != nil {
		return fmt.Errorf("encoding parity query: %w", err)
	}
	if len(dst) != size {
		return fmt.Errorf("%w: encoding parity query %d: destination holds %d values, query size is %d", ErrShape, j, len(dst), size)
	}
	if len(queries) != code.K {
		return fmt.Errorf("%w: encoding parity query %d: got %d queries, code %v groups %d", ErrShape, j, len(queries), code, code.K)
	}
	for i, q := range queries {
		if q != nil && len(q) != size {
			return fmt.Errorf("%w: encoding parity query %d: query %d holds %d values, query size is %d", ErrShape, j, i, len(q), size)
		}
	}
	return nil
}

// sumEncoder is the addition encoder of the paper (section 4.2), with the
// coefficients of section 7 for j > 0.
type sumEncoder struct {
	code Code
	size int
}

// NewSumEncoder: parity query j = sum_i c(j,i)·X_i, element-wise (for a linear model without
// bias, F(parity query j) == sum_i c(j,i) F(X_i) exactly: the deployed model is its own parity model).
// querySize is the number of float32 values of one query (>= 1).
func NewSumEncoder(code Code, querySize int) (Encoder, error) {
	if err := code.validate(); err != nil {
		return nil, fmt.Errorf("building sum encoder: %w", err)
	}
	if querySize < 1 {
		return nil, fmt.Errorf("%w: building sum encoder: query size %d, want >= 1", ErrShape, querySize)
	}
	return &sumEncoder{code: code, size: querySize}, nil
}

func (e *sumEncoder) QuerySize() int    { return e.size }
func (e *sumEncoder) Kind() EncoderKind { return EncoderSum }

func (e *sumEncoder) Encode(dst []float32, queries [][]float32, j int) error {
	if err := checkEncodeArgs(e.code, e.size, dst, queries, j); err != nil {
		return err
	}
	// Invariant after the first present query: dst holds the partial sum
	// over the present queries seen so far.
	started := false
	for i, q := range queries {
		if q == nil {
			continue // padding: a zero query adds nothing
		}
		q = q[:len(dst)]
		c := Coefficient(j, i)
		switch {
		case !started && c == 1:
			copy(dst, q)
		case !started:
			vecScale(dst, c, q)
		case c == 1:
			vecAdd(dst, q)
		default:
			vecAxpy(dst, c, q)
		}
		started = true
	}
	if !started {
		clear(dst) // every query is padding
	}
	return nil
}

// concatTap is one source pixel (index along one axis), the target pixel
// it contributes to, and its weight there.
type concatTap struct {
	dst, src int
	w        float32
}

// concatAxis is the area-averaging plan for one axis from src pixels down
// to n target pixels: target t reads taps[off[t]:off[t+1]] (all with dst
// t), whose weights sum to 1 (up to float32 rounding).
type concatAxis struct {
	n    int
	off  []int
	taps []concatTap
}

// newConcatAxis plans the box filter from src pixels to n <= src pixels.
// Target t covers the continuous source interval [t·src/n, (t+1)·src/n);
// source pixel s covers [s, s+1). In units of 1/n both are integer
// intervals ([t·src, (t+1)·src) and [s·n, (s+1)·n)), so the overlaps are
// exact integers and the weight of s in t is overlap/src (a target spans
// src/n source pixels, src units of 1/n).
func newConcatAxis(src, n int) concatAxis {
	a := concatAxis{n: n, off: make([]int, n+1)}
	for t := range n {
		lo, hi := t*src, (t+1)*src
		for s := lo / n; s*n < hi; s++ {
			ov := min(hi, (s+1)*n) - max(lo, s*n)
			if ov > 0 {
				a.taps = append(a.taps, concatTap{dst: t, src: s, w: float32(ov) / float32(src)})
			}
		}
		a.off[t+1] = len(a.taps)
	}
	return a
}

// concatTile places image i of a group: its top-left target pixel and the
// axis plans (indices into the encoder's rows and cols).
type concatTile struct {
	y0, x0   int
	row, col int
}

// concatEncoder is the image encoder of the paper (sections 4.2 and 5.2.3,
// figure 9).
type concatEncoder struct {
	code                    Code
	height, width, channels int
	gridRows, gridCols      int
	rows, cols              []concatAxis // per grid row (heights), per grid column (widths)
	tiles                   []concatTile // one per data query, i < K
}

// concatGrid is the tiling of k images: 1x2 for k = 2, else a
// ceil(sqrt(k)) square (2x2 for k = 3 and 4).
func concatGrid(k int) (rows, cols int) {
	if k == 2 {
		return 1, 2
	}
	g := int(math.Ceil(math.Sqrt(float64(k))))
	for g*g < k { // guard against rounding of Sqrt
		g++
	}
	return g, g
}

// NewConcatEncoder (images; paper section 4.2): downsample each of the k images (height x width x
// channels, row-major HWC) and tile them into one image of the original size: k=2 side by side halves
// (each image downsampled to height x width/2), k=4 quadrants, other k a ceil(sqrt(k)) grid (empty tiles
// zero). Downsampling by area averaging (box filter over the source pixels each target pixel covers,
// fractional coverage weighted), not nearest-neighbour. The same tiled image for every j (parity models
// for different j are trained for different targets). Error (naming the problem) when a tile would be
// smaller than 1 pixel or querySize != h*w*c.
//
// Image i goes to grid cell (i / cols, i % cols). Grid row g spans target
// rows [g·height/rows, (g+1)·height/rows) (integer division), columns
// likewise, so the tiles cover the image exactly and their sizes differ by
// at most one pixel when the grid does not divide the image. The query
// size is height·width·channels; Encode rejects queries of another length
// (ErrShape), and EncodeBatch rejects an encoder whose QuerySize differs from
// a tensor's row width.
func NewConcatEncoder(code Code, height, width, channels int) (Encoder, error) {
	if err := code.validate(); err != nil {
		return nil, fmt.Errorf("building concat encoder: %w", err)
	}
	if height < 1 || width < 1 || channels < 1 {
		return nil, fmt.Errorf("%w: building concat encoder: image %dx%dx%d (height x width x channels): every dimension must be >= 1", ErrShape, height, width, channels)
	}
	if height > math.MaxInt32 || width > math.MaxInt32 || channels > math.MaxInt32 ||
		int64(height)*int64(width) > math.MaxInt32/int64(channels) {
		return nil, fmt.Errorf("%w: building concat encoder: image %dx%dx%d is too large", ErrShape, height, width, channels)
	}
	gr, gc := concatGrid(code.K)
	if height/gr < 1 || width/gc < 1 {
		return nil, fmt.Errorf("%w: building concat encoder: image %dx%d cannot be tiled %dx%d for k=%d: a tile would be %dx%d pixels, smaller than 1 pixel",
			ErrShape, height, width, gr, gc, code.K, height/gr, width/gc)
	}
	e := &concatEncoder{
		code: code, height: height, width: width, channels: channels,
		gridRows: gr, gridCols: gc,
		rows:  make([]concatAxis, gr),
		cols:  make([]concatAxis, gc),
		tiles: make([]concatTile, code.K),
	}
	for g := range gr {
		e.rows[g] = newConcatAxis(height, (g+1)*height/gr-g*height/gr)
	}
	for g := range gc {
		e.cols[g] = newConcatAxis(width, (g+1)*width/gc-g*width/gc)
	}
	for i := range e.tiles {
		row, col := i/gc, i%gc
		e.tiles[i] = concatTile{y0: row * height / gr, x0: col * width / gc, row: row, col: col}
	}
	return e, nil
}

func (e *concatEncoder) QuerySize() int    { return e.height * e.width * e.channels }
func (e *concatEncoder) Kind() EncoderKind { return EncoderConcat }

func (e *concatEncoder) Encode(dst []float32, queries [][]float32, j int) error {
	if err := checkEncodeArgs(e.code, e.QuerySize(), dst, queries, j); err != nil {
		return err
	}
	// Target pixels are sums of weighted source pixels: start from zero
	// (which is also what empty tiles and padding queries leave).
	clear(dst)
	ch := e.channels
	stride := e.width * ch // values per image row
	for i, q := range queries {
		if q == nil {
			continue
		}
		t := e.tiles[i]
		ya, xa := &e.rows[t.row], &e.cols[t.col]
		for ty := range ya.n {
			row := (t.y0 + ty) * stride
			drow := dst[row+t.x0*ch : row+(t.x0+xa.n)*ch] // the tile's part of target row ty
			for _, yt := range ya.taps[ya.off[ty]:ya.off[ty+1]] {
				srow := q[yt.src*stride : (yt.src+1)*stride]
				// One pass over every x tap of the row: target pixel
				// xt.dst gains wy·wx·source pixel xt.src.
				if ch == 1 {
					for _, xt := range xa.taps {
						drow[xt.dst] += yt.w * xt.w * srow[xt.src]
					}
					continue
				}
				for _, xt := range xa.taps {
					w := yt.w * xt.w
					d := drow[xt.dst*ch : (xt.dst+1)*ch]
					s := srow[xt.src*ch : (xt.src+1)*ch]
					for c := range d {
						d[c] += w * s[c]
					}
				}
			}
		}
	}
	return nil
}
