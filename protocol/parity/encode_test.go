package parity

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseEncoder(t *testing.T) {
	for s, want := range map[string]EncoderKind{"sum": EncoderSum, "concat": EncoderConcat, "SUM": EncoderSum, " Concat ": EncoderConcat} {
		got, err := ParseEncoder(s)
		if err != nil || got != want {
			t.Errorf("ParseEncoder(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"xor", "", "sums"} {
		_, err := ParseEncoder(s)
		if !errors.Is(err, ErrUnknownEncoder) {
			t.Errorf("ParseEncoder(%q) error %v, want ErrUnknownEncoder", s, err)
			continue
		}
		for _, name := range []string{`"` + s + `"`, `"sum"`, `"concat"`} {
			if !strings.Contains(err.Error(), name) {
				t.Errorf("ParseEncoder(%q) error %q does not name %s", s, err, name)
			}
		}
	}
	if EncoderSum.String() != "sum" || EncoderConcat.String() != "concat" || EncoderKind(0).String() != "EncoderKind(0)" {
		t.Errorf("String: %q %q %q", EncoderSum, EncoderConcat, EncoderKind(0))
	}
	// String and ParseEncoder round-trip.
	for _, k := range []EncoderKind{EncoderSum, EncoderConcat} {
		if got, err := ParseEncoder(k.String()); err != nil || got != k {
			t.Errorf("ParseEncoder(%q) = %v, %v", k, got, err)
		}
	}
}

func TestSumEncoder(t *testing.T) {
	code, _ := NewCode(3, 3)
	enc, err := NewSumEncoder(code, 2)
	if err != nil {
		t.Fatal(err)
	}
	if enc.QuerySize() != 2 || enc.Kind() != EncoderSum {
		t.Fatalf("QuerySize %d Kind %v", enc.QuerySize(), enc.Kind())
	}
	x0, x1, x2 := []float32{1, -1}, []float32{10, 20}, []float32{100, 300}
	for _, tc := range []struct {
		queries [][]float32
		j       int
		want    []float32
	}{
		{[][]float32{x0, x1, x2}, 0, []float32{111, 319}},
		{[][]float32{x0, x1, x2}, 1, []float32{1 + 20 + 300, -1 + 40 + 900}},
		{[][]float32{x0, x1, x2}, 2, []float32{1 + 40 + 900, -1 + 80 + 2700}},
		{[][]float32{nil, x1, x2}, 1, []float32{20 + 300, 40 + 900}}, // padding first
		{[][]float32{x0, nil, nil}, 2, []float32{1, -1}},
		{[][]float32{nil, nil, x2}, 2, []float32{900, 2700}},
		{[][]float32{nil, nil, nil}, 0, []float32{0, 0}},
	} {
		dst := []float32{float32(math.NaN()), 42} // garbage must be overwritten
		if err := enc.Encode(dst, tc.queries, tc.j); err != nil {
			t.Errorf("Encode(%v, j=%d): %v", tc.queries, tc.j, err)
			continue
		}
		if dst[0] != tc.want[0] || dst[1] != tc.want[1] {
			t.Errorf("Encode(%v, j=%d) = %v, want %v", tc.queries, tc.j, dst, tc.want)
		}
	}
}

func TestEncoderErrors(t *testing.T) {
	code, _ := NewCode(2, 1)
	sum, _ := NewSumEncoder(code, 4)
	concat, _ := NewConcatEncoder(code, 2, 2, 1)
	q := make([]float32, 4)
	for _, enc := range []Encoder{sum, concat} {
		for _, tc := range []struct {
			name    string
			dst     []float32
			queries [][]float32
			j       int
			is      error
			want    string
		}{
			{"short destination", make([]float32, 3), [][]float32{q, q}, 0, ErrShape, "destination holds 3"},
			{"long query", make([]float32, 4), [][]float32{q, make([]float32, 5)}, 0, ErrShape, "query 1 holds 5"},
			{"too many queries", make([]float32, 4), [][]float32{q, q, q}, 0, ErrShape, "got 3 queries"},
			{"parity index", make([]float32, 4), [][]float32{q, q}, 1, ErrBadCode, "parity index 1"},
			{"negative parity index", make([]float32, 4), [][]float32{q, q}, -1, ErrBadCode, "parity index -1"},
		} {
			err := enc.Encode(tc.dst, tc.queries, tc.j)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v encoder, %s: error %v, want %v naming %q", enc.Kind(), tc.name, err, tc.is, tc.want)
			}
		}
	}
	if _, err := NewSumEncoder(code, 0); !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), "query size 0") {
		t.Errorf("NewSumEncoder size 0: %v", err)
	}
	if _, err := NewSumEncoder(Code{K: 2, R: 9}, 3); !errors.Is(err, ErrBadCode) || !strings.Contains(err.Error(), "r=9") {
		t.Errorf("NewSumEncoder bad code: %v", err)
	}
}

func TestNewConcatEncoderValidation(t *testing.T) {
	code2, _ := NewCode(2, 1)
	code4, _ := NewCode(4, 1)
	code10, _ := NewCode(10, 1)
	for _, tc := range []struct {
		name      string
		code      Code
		h, w, c   int
		is        error
		wantParts []string
	}{
		{"k=2 one column", code2, 28, 1, 1, ErrShape, []string{"28x1", "1x2", "smaller than 1 pixel"}},
		{"k=4 one row", code4, 1, 28, 3, ErrShape, []string{"1x28", "2x2", "smaller than 1 pixel"}},
		{"k=10 3x3 image", code10, 3, 3, 1, ErrShape, []string{"4x4", "k=10", "smaller than 1 pixel"}},
		{"zero channels", code2, 28, 28, 0, ErrShape, []string{"28x28x0", ">= 1"}},
		{"negative height", code2, -1, 28, 1, ErrShape, []string{"-1x28x1"}},
		{"bad code", Code{K: 20, R: 1}, 28, 28, 1, ErrBadCode, []string{"k=20"}},
	} {
		_, err := NewConcatEncoder(tc.code, tc.h, tc.w, tc.c)
		if !errors.Is(err, tc.is) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.is)
			continue
		}
		for _, p := range tc.wantParts {
			if !strings.Contains(err.Error(), p) {
				t.Errorf("%s: error %q does not name %q", tc.name, err, p)
			}
		}
	}
	// The smallest images that tile.
	for _, tc := range []struct {
		code    Code
		h, w, c int
	}{{code2, 1, 2, 1}, {code4, 2, 2, 3}, {code10, 4, 4, 1}} {
		enc, err := NewConcatEncoder(tc.code, tc.h, tc.w, tc.c)
		if err != nil {
			t.Errorf("NewConcatEncoder(k=%d, %dx%dx%d): %v", tc.code.K, tc.h, tc.w, tc.c, err)
			continue
		}
		if enc.QuerySize() != tc.h*tc.w*tc.c || enc.Kind() != EncoderConcat {
			t.Errorf("QuerySize %d, Kind %v", enc.QuerySize(), enc.Kind())
		}
	}
}

// parTestConst is an h x w x c image of one value.
func parTestConst(h, w, c int, v float32) []float32 {
	img := make([]float32, h*w*c)
	for i := range img {
		img[i] = v
	}
	return img
}

// parTestConcat encodes with a new concat encoder, failing the test on error.
func parTestConcat(t *testing.T, k, r, h, w, c int, queries [][]float32, j int) []float32 {
	t.Helper()
	code, err := NewCode(k, r)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := NewConcatEncoder(code, h, w, c)
	if err != nil {
		t.Fatal(err)
	}
	dst := parTestConst(h, w, c, float32(math.NaN()))
	if err := enc.Encode(dst, queries, j); err != nil {
		t.Fatal(err)
	}
	return dst
}

// parTestCheckRegion checks that pixels [y0,y1) x [x0,x1) of an h x w x c
// image, channel ch, equal want (within float rounding).
func parTestCheckRegion(t *testing.T, what string, img []float32, w, c, y0, y1, x0, x1, ch int, want float32) {
	t.Helper()
	bad := 0
	for y := y0; y < y1; y++ {
		for x := x0; x < x1; x++ {
			got := img[(y*w+x)*c+ch]
			if math.Abs(float64(got-want)) > 1e-5*max(1, math.Abs(float64(want))) {
				if bad < 3 {
					t.Errorf("%s: pixel (%d,%d) channel %d = %v, want %v", what, y, x, ch, got, want)
				}
				bad++
			}
		}
	}
	if bad > 3 {
		t.Errorf("%s: %d pixels wrong in all", what, bad)
	}
}

func TestConcatK2Halves(t *testing.T) {
	const h, w = 28, 28
	for j := range 2 { // the same tiled image for every parity index
		dst := parTestConcat(t, 2, 2, h, w, 1, [][]float32{parTestConst(h, w, 1, 3), parTestConst(h, w, 1, 7)}, j)
		parTestCheckRegion(t, "left half", dst, w, 1, 0, h, 0, 14, 0, 3)
		parTestCheckRegion(t, "right half", dst, w, 1, 0, h, 14, 28, 0, 7)
	}
	// A short batch: the second query is padding, a zero image.
	dst := parTestConcat(t, 2, 1, h, w, 1, [][]float32{parTestConst(h, w, 1, 3), nil}, 0)
	parTestCheckRegion(t, "left half", dst, w, 1, 0, h, 0, 14, 0, 3)
	parTestCheckRegion(t, "padding half", dst, w, 1, 0, h, 14, 28, 0, 0)
}

func TestConcatK4Quadrants(t *testing.T) {
	const h, w, c = 28, 28, 3
	queries := make([][]float32, 4)
	for i := range queries {
		queries[i] = make([]float32, h*w*c)
		for p := range h * w {
			for ch := range c {
				queries[i][p*c+ch] = float32(10*(i+1) + ch) // per image and channel
			}
		}
	}
	dst := parTestConcat(t, 4, 1, h, w, c, queries, 0)
	for i, q := range [][4]int{{0, 14, 0, 14}, {0, 14, 14, 28}, {14, 28, 0, 14}, {14, 28, 14, 28}} {
		for ch := range c {
			parTestCheckRegion(t, "quadrant", dst, w, c, q[0], q[1], q[2], q[3], ch, float32(10*(i+1)+ch))
		}
	}
}

func TestConcatK3GridWithZeroTile(t *testing.T) {
	const h, w = 28, 28
	dst := parTestConcat(t, 3, 1, h, w, 1, [][]float32{parTestConst(h, w, 1, 1), parTestConst(h, w, 1, 2), parTestConst(h, w, 1, 3)}, 0)
	parTestCheckRegion(t, "tile 0", dst, w, 1, 0, 14, 0, 14, 0, 1)
	parTestCheckRegion(t, "tile 1", dst, w, 1, 0, 14, 14, 28, 0, 2)
	parTestCheckRegion(t, "tile 2", dst, w, 1, 14, 28, 0, 14, 0, 3)
	parTestCheckRegion(t, "empty tile", dst, w, 1, 14, 28, 14, 28, 0, 0)
}

func TestConcatK5Grid3x3(t *testing.T) {
	// 3x3 grid over a 30x30 image: tiles of 10x10, images in row-major
	// cells, cells 5..8 empty.
	const h, w = 30, 30
	queries := make([][]float32, 5)
	for i := range queries {
		queries[i] = parTestConst(h, w, 1, float32(i+1))
	}
	dst := parTestConcat(t, 5, 1, h, w, 1, queries, 0)
	for cell := range 9 {
		want := float32(0)
		if cell < 5 {
			want = float32(cell + 1)
		}
		y, x := cell/3*10, cell%3*10
		parTestCheckRegion(t, "cell", dst, w, 1, y, y+10, x, x+10, 0, want)
	}
}

// TestConcatAreaAveragingPreservesMean: area averaging keeps the mass of
// an image: a constant image stays that constant in its tile, and for any
// image the mean of its tile equals its mean, also when the grid does not
// divide the image (fractional coverage).
func TestConcatAreaAveragingPreservesMean(t *testing.T) {
	rng := parTestRand(t)
	for _, tc := range []struct{ k, h, w, c int }{{2, 28, 28, 1}, {4, 27, 29, 2}, {3, 31, 17, 1}, {9, 28, 28, 3}, {2, 5, 7, 1}} {
		code, _ := NewCode(tc.k, 1)
		enc, err := NewConcatEncoder(code, tc.h, tc.w, tc.c)
		if err != nil {
			t.Fatal(err)
		}
		gr, gc := concatGrid(tc.k)
		for _, random := range []bool{false, true} {
			queries := make([][]float32, tc.k)
			for i := range queries {
				if random {
					queries[i] = parTestVec(rng, tc.h*tc.w*tc.c)
				} else {
					queries[i] = parTestConst(tc.h, tc.w, tc.c, 0.37*float32(i+1))
				}
			}
			dst := make([]float32, enc.QuerySize())
			if err := enc.Encode(dst, queries, 0); err != nil {
				t.Fatal(err)
			}
			for i, q := range queries {
				row, col := i/gc, i%gc
				y0, y1 := row*tc.h/gr, (row+1)*tc.h/gr
				x0, x1 := col*tc.w/gc, (col+1)*tc.w/gc
				for ch := range tc.c {
					var src, tile float64
					for p := range tc.h * tc.w {
						src += float64(q[p*tc.c+ch])
					}
					src /= float64(tc.h * tc.w)
					for y := y0; y < y1; y++ {
						for x := x0; x < x1; x++ {
							tile += float64(dst[(y*tc.w+x)*tc.c+ch])
						}
					}
					tile /= float64((y1 - y0) * (x1 - x0))
					if math.Abs(tile-src) > 1e-5 {
						t.Errorf("k=%d %dx%dx%d random=%v image %d channel %d: tile mean %.7f, image mean %.7f", tc.k, tc.h, tc.w, tc.c, random, i, ch, tile, src)
					}
					if !random {
						parTestCheckRegion(t, "constant tile", dst, tc.w, tc.c, y0, y1, x0, x1, ch, 0.37*float32(i+1))
					}
				}
			}
		}
	}
}

// TestConcatNotNearestNeighbour: a one-pixel checkerboard halved by area
// averaging is uniformly 0.5 (nearest-neighbour sampling would give
// stripes of 0 and 1), and fractional coverage is weighted.
func TestConcatNotNearestNeighbour(t *testing.T) {
	const h, w = 28, 28
	board := make([]float32, h*w)
	for y := range h {
		for x := range w {
			board[y*w+x] = float32((x + y) % 2)
		}
	}
	dst := parTestConcat(t, 2, 1, h, w, 1, [][]float32{board, board}, 0)
	parTestCheckRegion(t, "k=2 checkerboard", dst, w, 1, 0, h, 0, w, 0, 0.5)
	dst = parTestConcat(t, 4, 1, h, w, 1, [][]float32{board, board, board, board}, 0)
	parTestCheckRegion(t, "k=4 checkerboard", dst, w, 1, 0, h, 0, w, 0, 0.5)

	// A 1x3 image [0 3 6] tiled for k=2: the left tile is 1 pixel wide
	// (the mean, 3), the right one 2 pixels covering [0,1.5) and [1.5,3):
	// (0·1 + 3·0.5)/1.5 = 1 and (3·0.5 + 6·1)/1.5 = 5.
	img := []float32{0, 3, 6}
	dst = parTestConcat(t, 2, 1, 1, 3, 1, [][]float32{img, img}, 0)
	want := []float32{3, 1, 5}
	for x := range want {
		if math.Abs(float64(dst[x]-want[x])) > 1e-6 {
			t.Errorf("fractional coverage: got %v, want %v", dst, want)
			break
		}
	}
}
