package parity

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error of this package wraps one of them (or a
// tensor validation error of internal/tensor), and says what was attempted.
var (
	// ErrBadCode: code parameters (k, r) or a parity index j out of range.
	ErrBadCode = errors.New("parity: bad code")
	// ErrUndecodable: more data outputs are missing than parity outputs
	// are present, so the missing ones cannot be reconstructed.
	ErrUndecodable = errors.New("parity: undecodable")
	// ErrShape: lengths, tensor names, datatypes, widths or row counts do
	// not fit together.
	ErrShape = errors.New("parity: shape mismatch")
	// ErrUnknownEncoder: ParseEncoder was given a name it does not know.
	ErrUnknownEncoder = errors.New("parity: unknown encoder")
)

// Limits of NewCode.
const (
	codeMinK = 2  // smallest coding group
	codeMaxK = 16 // largest coding group
	codeMinR = 1  // fewest parity models
	codeMaxR = 4  // most parity models
	// codeMaxN bounds k+r: the data and parity outputs of one group.
	codeMaxN = 20
)

// Coefficient is c(j,i): parity model j (0-based, j < r) is trained to output
// sum_i c(j,i)·F(X_i) over the k queries of a group (i 0-based). c(j,i) = (i+1)^j:
// j = 0 is the plain sum F(X1)+...+F(Xk); j = 1 gives F(X1)+2F(X2)+... (paper section 7).
// With positive distinct nodes and increasing exponents every square submatrix of this
// generalised Vandermonde matrix is nonsingular, so any k of the k+r outputs determine the rest.
//
// THE single definition of the coefficients: encoders, decoders and the
// trainer of parity models all use it. For i < 16 and j < 4 the value is
// at most 16^3 = 4096, an integer that float32 represents exactly.
// Negative arguments are a programming error and yield 0.
func Coefficient(j, i int) float32 {
	if j < 0 || i < 0 {
		return 0
	}
	c := float32(1)
	node := float32(i + 1)
	for range j {
		c *= node
	}
	return c
}

// Code is a (k, r) parity code: a coding group holds K data queries (and
// their K data outputs) and R parity queries (one per parity model).
// Invariant (for a Code from NewCode): 2 <= K <= 16, 1 <= R <= 4,
// K+R <= 20.
type Code struct {
	K, R int
}

// NewCode validates k and r.
func NewCode(k, r int) (Code, error) {
	if k < codeMinK || k > codeMaxK {
		return Code{}, fmt.Errorf("%w: k=%d: coding group size must be in %d..%d", ErrBadCode, k, codeMinK, codeMaxK)
	}
	if r < codeMinR || r > codeMaxR {
		return Code{}, fmt.Errorf("%w: r=%d: parity count must be in %d..%d", ErrBadCode, r, codeMinR, codeMaxR)
	}
	if k+r > codeMaxN {
		return Code{}, fmt.Errorf("%w: k=%d, r=%d: k+r=%d exceeds %d", ErrBadCode, k, r, k+r, codeMaxN)
	}
	return Code{K: k, R: r}, nil
}

// String is "(k=K,r=R)".
func (c Code) String() string { return fmt.Sprintf("(k=%d,r=%d)", c.K, c.R) }

// validate re-checks a Code that may not come from NewCode (a literal).
func (c Code) validate() error {
	_, err := NewCode(c.K, c.R)
	return err
}

// checkParityIndex checks 0 <= j < R.
func (c Code) checkParityIndex(j int) error {
	if j < 0 || j >= c.R {
		return fmt.Errorf("%w: parity index %d out of range 0..%d for code %v", ErrBadCode, j, c.R-1, c)
	}
	return nil
}

// CanDecode reports whether the given availability allows reconstructing every missing data output.
// haveData has K entries (data output i arrived), haveParity R entries
// (parity output j arrived); other lengths report false. Because every square
// submatrix of the coefficients is nonsingular (the code is MDS), the only
// condition is that at least as many parities arrived as data outputs are
// missing; which ones does not matter.
func (c Code) CanDecode(haveData []bool, haveParity []bool) bool {
	if len(haveData) != c.K || len(haveParity) != c.R {
		return false
	}
	missing, parities := 0, 0
	for _, h := range haveData {
		if !h {
			missing++
		}
	}
	for _, h := range haveParity {
		if h {
			parities++
		}
	}
	return missing <= parities
}
