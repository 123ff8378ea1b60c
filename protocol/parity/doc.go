// Package parity is the coding layer of ParM (parity models, Kosaian et
// al., SOSP 2019, sections 4 and 7) for stateless replicated models: it
// encodes the queries of a coding group into parity queries, and decodes
// the outputs of parity models back into data outputs that went missing
// (a slow or failed backend).
//
// # The code
//
// A Code (k, r) groups k data queries X_0..X_{k-1}; r parity models answer
// r parity queries. Parity model j (0 <= j < r) is trained to output
//
//	P_j = sum_i c(j,i)·F(X_i),   c(j,i) = (i+1)^j   (Coefficient)
//
// so P_0 is the plain sum of the paper's addition code, and P_1 = F(X_0) +
// 2F(X_1) + ... the second transformation of section 7. Coefficient is the
// only definition of the coefficients; encoders, the decoder and the
// trainer of parity models all use it.
//
// Decoding is linear algebra on the k+r outputs of a group. With the data
// outputs in M missing (m = |M|) and m parities P available, the residuals
// P_j - sum_{i not in M} c(j,i)·F(X_i) equal A·F(X_M), A[j][b] = c(j,b) for
// j in P and b in M. A is a square submatrix of the r x k matrix of
// coefficients, a generalised Vandermonde matrix with distinct positive
// nodes 1..k and increasing exponents 0..r-1. Such a matrix is totally
// positive: every square submatrix has a positive determinant (tested
// exhaustively, in exact integers, for k = 16, r = 4). So A is invertible
// for every choice of M and P: the code is MDS, any k of the k+r outputs
// determine the others, and the decoder may use whichever m parities
// arrived (it takes the first m). For m = 1 and parity 0 decoding is the
// paper's subtraction, F(X_b) = P_0 - sum_{i != b} F(X_i); otherwise the
// Decoder inverts A with gonum/mat once per (missing set, parity set)
// pattern, caches the inverse, and evaluates residuals and products in
// float64. A bigger code is worse conditioned: decoding a linear model's
// float32 outputs loses about 1e-7 relative accuracy for r = 1, 1e-4 at
// k = 8, r = 4 and 2e-3 at k = 16, r = 4 (with learned parity models the
// model's approximation error dominates anyway).
//
// # Encoders
//
// The sum encoder (NewSumEncoder, "sum") makes parity query j =
// sum_i c(j,i)·X_i element-wise. A linear model without bias is then its
// own parity model, exactly up to float rounding (which is how the tests
// check the decoder):
// F(sum_i c(j,i)·X_i) = sum_i c(j,i)·F(X_i).
//
// The concat encoder (NewConcatEncoder, "concat", sections 4.2 and 5.2.3 of the
// paper) is for images (height x width x channels, row-major HWC): it
// downsamples the k images and tiles them into one image of the original
// size: two halves side by side for k = 2, quadrants for k = 4, otherwise
// a ceil(sqrt(k)) x ceil(sqrt(k)) grid with the unused tiles zero.
// Downsampling averages areas (a box filter weighting every source pixel
// by the fraction of it a target pixel covers), which keeps each image's
// mean; nearest-neighbour sampling would alias fine patterns. Every
// parity index gets the same tiled image: parity models of different j
// differ in what they are trained to output, not in their input.
//
// # Batches and padding
//
// EncodeBatch and DecodeBatch apply the code to whole batches of FP32
// hamsv1 tensors of shape [rows, ...], one query per row; every input
// tensor of a multi-input model is encoded on its own. The batches of one
// group may have different row counts: the parity batch has as many rows
// as the longest, and row q of it encodes rows q of every batch that has
// one, the missing rows counting as zero queries (padding). Decoding row
// q likewise counts the rows a batch lacks as zero outputs, so a missing
// batch only needs a parity for the rows it has. DecodeBatch (and
// CheckParityShape) refuses parity outputs whose tensors do not match the
// data outputs in name, datatype, row shape or row count, so that a
// parity backend answering garbage is treated as failed rather than
// corrupting a reply.
//
// # Purity
//
// This package is pure computation: no I/O, no goroutines, no clocks. The
// pool's Machine (group.go) is a protocol.Machine: its events (step.go)
// carry the driver's time, and TimePassed is delivered at NextDeadline.
// Encoders are immutable after construction and Encode allocates nothing;
// a Decoder's only mutable state is its cache of inverses, guarded by a
// mutex, so it is safe for concurrent use, and Reconstruct allocates
// nothing for r = 1 and for cached patterns.
package parity
