package parity

import (
	"fmt"
	"math"
	"slices"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// batchTensorInfo is what a batch tensor must agree on across the batches
// of a group: its trailing dimensions (the shape of one row) and the
// number of float32 values of a row.
type batchTensorInfo struct {
	rows     int
	trailing []int64
	width    int
}

// inspectBatchTensor validates t as an FP32 tensor of rows (rank >= 1,
// data length matching the shape). Errors wrap ErrShape and name the
// tensor; what names the batch is left to the caller.
func inspectBatchTensor(t *hamsv1.Tensor) (batchTensorInfo, error) {
	if t == nil {
		return batchTensorInfo{}, fmt.Errorf("%w: nil tensor", ErrShape)
	}
	if t.Datatype != tensor.FP32 {
		return batchTensorInfo{}, fmt.Errorf("%w: tensor %q is %s, parity coding needs FP32", ErrShape, t.Name, t.Datatype)
	}
	if len(t.Shape) == 0 {
		return batchTensorInfo{}, fmt.Errorf("%w: tensor %q is a scalar, parity coding needs rows (shape [rows, ...])", ErrShape, t.Name)
	}
	if err := tensor.Validate(t); err != nil {
		return batchTensorInfo{}, fmt.Errorf("%w: %w", ErrShape, err)
	}
	w, err := tensor.NumElements(t.Shape[1:])
	if err != nil || w > math.MaxInt32 || t.Shape[0] > math.MaxInt32 {
		return batchTensorInfo{}, fmt.Errorf("%w: tensor %q: shape %v is too large", ErrShape, t.Name, t.Shape)
	}
	return batchTensorInfo{rows: int(t.Shape[0]), trailing: t.Shape[1:], width: int(w)}, nil
}

// findBatchTensor returns the tensor of batch named name, looking at
// position hint first (batches usually list their tensors in one order).
func findBatchTensor(batch []*hamsv1.Tensor, name string, hint int) *hamsv1.Tensor {
	if hint < len(batch) && batch[hint] != nil && batch[hint].Name == name {
		return batch[hint]
	}
	for _, t := range batch {
		if t != nil && t.Name == name {
			return t
		}
	}
	return nil
}

// matchBatchTensor finds template tensor tmpl (position ti) in batch and
// checks that it agrees with it: same name, FP32, same row shape.
func matchBatchTensor(batch []*hamsv1.Tensor, tmpl *hamsv1.Tensor, ti int, want batchTensorInfo) (*hamsv1.Tensor, batchTensorInfo, error) {
	t := findBatchTensor(batch, tmpl.Name, ti)
	if t == nil {
		return nil, batchTensorInfo{}, fmt.Errorf("%w: no tensor %q", ErrShape, tmpl.Name)
	}
	info, err := inspectBatchTensor(t)
	if err != nil {
		return nil, batchTensorInfo{}, err
	}
	if !slices.Equal(info.trailing, want.trailing) {
		return nil, batchTensorInfo{}, fmt.Errorf("%w: tensor %q has rows of shape %v, want %v", ErrShape, t.Name, info.trailing, want.trailing)
	}
	return t, info, nil
}

// EncodeBatch builds parity batch j from the k input batches (same tensor names, datatypes and row
// widths across batches, else an error naming the tensor and the batch). Every FP32 input tensor is
// encoded with enc (non-FP32 inputs: error ErrShape naming the tensor). newEncoder is called per tensor
// with that tensor's row width, so multi-input models work: func(querySize int) (Encoder, error).
//
// A data batch is []*hamsv1.Tensor (its input tensors), each FP32 with
// shape [rows, d1, d2, ...]; a query is the slice of one row. Batches of
// one group may have different row counts: the parity batch has max(rows)
// rows, and row q of it encodes rows q of every batch that has one (the
// others are zero padding). A nil batch counts as a batch of zero rows (a
// group closed short). The tensors of every batch share their row shape
// (trailing dimensions), not only the width, and the tensors of one batch
// share their row count. The returned tensors are new, in the order of the
// first non-nil batch, shaped [max(rows), d1, d2, ...].
func EncodeBatch(code Code, newEncoder func(querySize int) (Encoder, error), j int, batches [][]*hamsv1.Tensor) ([]*hamsv1.Tensor, error) {
	if err := code.validate(); err != nil {
		return nil, fmt.Errorf("encoding parity batch %d: %w", j, err)
	}
	if err := code.checkParityIndex(j); err != nil {
		return nil, fmt.Errorf("encoding parity batch: %w", err)
	}
	if len(batches) != code.K {
		return nil, fmt.Errorf("%w: encoding parity batch %d: got %d batches, code %v groups %d", ErrShape, j, len(batches), code, code.K)
	}
	tmplIdx := slices.IndexFunc(batches, func(b []*hamsv1.Tensor) bool { return b != nil })
	if tmplIdx < 0 {
		return nil, fmt.Errorf("%w: encoding parity batch %d: every batch is nil", ErrShape, j)
	}
	tmpl := batches[tmplIdx]
	if len(tmpl) == 0 {
		return nil, fmt.Errorf("%w: encoding parity batch %d: batch %d has no tensors", ErrShape, j, tmplIdx)
	}
	infos := make([]batchTensorInfo, len(tmpl))
	for ti, t := range tmpl {
		info, err := inspectBatchTensor(t)
		if err != nil {
			return nil, fmt.Errorf("encoding parity batch %d: batch %d: %w", j, tmplIdx, err)
		}
		infos[ti] = info
	}
	// rows[i]: row count of batch i; the tensors of one batch must agree.
	rows := make([]int, code.K)
	maxRows := 0
	for i, b := range batches {
		if b == nil {
			continue
		}
		if len(b) != len(tmpl) {
			return nil, fmt.Errorf("%w: encoding parity batch %d: batch %d has %d tensors, batch %d has %d", ErrShape, j, i, len(b), tmplIdx, len(tmpl))
		}
		for ti, t := range tmpl {
			_, info, err := matchBatchTensor(b, t, ti, infos[ti])
			if err != nil {
				return nil, fmt.Errorf("encoding parity batch %d: batch %d: %w", j, i, err)
			}
			if ti == 0 {
				rows[i] = info.rows
			} else if info.rows != rows[i] {
				return nil, fmt.Errorf("%w: encoding parity batch %d: batch %d: tensor %q has %d rows, tensor %q %d", ErrShape, j, i, t.Name, info.rows, tmpl[0].Name, rows[i])
			}
		}
		maxRows = max(maxRows, rows[i])
	}

	out := make([]*hamsv1.Tensor, len(tmpl))
	queries := make([][]float32, code.K)
	data := make([][]float32, code.K)
	for ti, t := range tmpl {
		w := infos[ti].width
		enc, err := newEncoder(w)
		if err != nil {
			return nil, fmt.Errorf("encoding parity batch %d: building the encoder of tensor %q (row width %d): %w", j, t.Name, w, err)
		}
		if enc.QuerySize() != w {
			return nil, fmt.Errorf("%w: encoding parity batch %d: tensor %q has rows of %d values, its %v encoder takes queries of %d", ErrShape, j, t.Name, w, enc.Kind(), enc.QuerySize())
		}
		for i, b := range batches {
			data[i] = nil
			if b == nil {
				continue
			}
			if data[i], err = tensor.Float32(findBatchTensor(b, t.Name, ti)); err != nil {
				return nil, fmt.Errorf("%w: encoding parity batch %d: batch %d: %w", ErrShape, j, i, err)
			}
		}
		par := make([]float32, maxRows*w)
		for q := range maxRows {
			if w == 0 {
				break // rows of no values: nothing to encode
			}
			for i := range queries {
				queries[i] = nil // padding unless batch i has row q
				if q < rows[i] {
					queries[i] = data[i][q*w : (q+1)*w]
				}
			}
			if err := enc.Encode(par[q*w:(q+1)*w], queries, j); err != nil {
				return nil, fmt.Errorf("encoding parity batch %d: tensor %q row %d: %w", j, t.Name, q, err)
			}
		}
		shape := append([]int64{int64(maxRows)}, infos[ti].trailing...)
		out[ti] = tensor.FromFloat32(t.Name, shape, par)
	}
	return out, nil
}

// CheckParityShape checks that a parity batch's outputs fit the data
// outputs, as outputsTemplate (one data batch's output tensors) shows them:
// the same number of tensors, the same names, all FP32, the same row shapes
// (trailing dimensions), consistent data, and at least maxRows rows (the
// longest data batch of the group). Any mismatch is an ErrShape error
// naming the tensor: the pool then treats the parity as failed, since a
// parity backend answering garbage must never corrupt a reply. Used by
// DecodeBatch; exported so the pool can check a parity when it arrives.
func CheckParityShape(outputsTemplate []*hamsv1.Tensor, parity []*hamsv1.Tensor, maxRows uint32) error {
	if parity == nil {
		return fmt.Errorf("%w: checking parity outputs: no parity outputs", ErrShape)
	}
	if len(parity) != len(outputsTemplate) {
		return fmt.Errorf("%w: checking parity outputs: %d tensors, data outputs have %d", ErrShape, len(parity), len(outputsTemplate))
	}
	for ti, t := range outputsTemplate {
		want, err := inspectBatchTensor(t)
		if err != nil {
			return fmt.Errorf("checking parity outputs against the data outputs: %w", err)
		}
		_, info, err := matchBatchTensor(parity, t, ti, want)
		if err != nil {
			return fmt.Errorf("checking parity outputs: %w", err)
		}
		if uint64(info.rows) < uint64(maxRows) {
			return fmt.Errorf("%w: checking parity outputs: tensor %q has %d rows, the group's longest batch %d", ErrShape, t.Name, info.rows, maxRows)
		}
	}
	return nil
}

// DecodeBatch reconstructs the missing data batches' outputs. outputs[i]: data batch i's output
// tensors or nil if missing; rows[i]: row count of data batch i (known from its request, also for
// missing ones); parities[j]: parity batch j's outputs or nil. Returns, for each missing i in increasing
// order, its reconstructed output tensors (same names/datatypes/row widths as the present outputs,
// rows[i] rows). A parity output whose tensor names, datatypes, widths or row count (must be >= max
// rows) do not match the data outputs is an ErrShape error (the pool then treats that parity as
// failed: a parity backend answering garbage must never corrupt a reply). Rows of a present data batch
// that is shorter than row q count as zero (padding) in the subtraction.
//
// Row q is decoded on its own: the data batches missing at row q are the
// missing ones with more than q rows, so a missing batch of zero rows needs
// no parity (its result is tensors of zero rows). A present data batch
// whose outputs disagree with the first present one, or whose row count is
// not rows[i], is an ErrShape error naming the batch. When every data
// output is missing the first parity present gives the tensor names and row
// shapes (nothing else can be checked). Errors about a parity name its
// index j.
func DecodeBatch(dec *Decoder, outputs [][]*hamsv1.Tensor, rows []uint32, parities [][]*hamsv1.Tensor) ([][]*hamsv1.Tensor, error) {
	code := dec.Code()
	if err := code.validate(); err != nil {
		return nil, fmt.Errorf("decoding batches: %w", err)
	}
	if len(outputs) != code.K || len(rows) != code.K || len(parities) != code.R {
		return nil, fmt.Errorf("%w: decoding batches: got %d data outputs, %d row counts and %d parity outputs, code %v wants %d, %d and %d",
			ErrShape, len(outputs), len(rows), len(parities), code, code.K, code.K, code.R)
	}
	var missing []int
	needed := 0 // data batches missing at row 0
	maxRows := uint32(0)
	for i, o := range outputs {
		if o == nil {
			missing = append(missing, i)
			if rows[i] > 0 {
				needed++
			}
		}
		maxRows = max(maxRows, rows[i])
	}
	if len(missing) == 0 {
		return [][]*hamsv1.Tensor{}, nil
	}
	present := 0
	for _, p := range parities {
		if p != nil {
			present++
		}
	}
	if needed > present {
		return nil, fmt.Errorf("%w: decoding batches: %d data batches with rows missing, %d parity batches present (code %v)", ErrUndecodable, needed, present, code)
	}

	// The template: the first present data output, else the first parity.
	var tmpl []*hamsv1.Tensor
	tmplIdx := slices.IndexFunc(outputs, func(o []*hamsv1.Tensor) bool { return o != nil })
	if tmplIdx >= 0 {
		tmpl = outputs[tmplIdx]
	} else if j := slices.IndexFunc(parities, func(p []*hamsv1.Tensor) bool { return p != nil }); j >= 0 {
		tmpl = parities[j]
	} else {
		return nil, fmt.Errorf("%w: decoding batches: no data or parity outputs present", ErrUndecodable)
	}
	if len(tmpl) == 0 {
		return nil, fmt.Errorf("%w: decoding batches: the outputs have no tensors", ErrShape)
	}
	infos := make([]batchTensorInfo, len(tmpl))
	for ti, t := range tmpl {
		info, err := inspectBatchTensor(t)
		if err != nil {
			return nil, fmt.Errorf("decoding batches: outputs: %w", err)
		}
		infos[ti] = info
	}
	for i, o := range outputs {
		if o == nil {
			continue
		}
		if len(o) != len(tmpl) {
			return nil, fmt.Errorf("%w: decoding batches: data batch %d has %d output tensors, data batch %d has %d", ErrShape, i, len(o), tmplIdx, len(tmpl))
		}
		for ti, t := range tmpl {
			_, info, err := matchBatchTensor(o, t, ti, infos[ti])
			if err != nil {
				return nil, fmt.Errorf("decoding batches: data batch %d: %w", i, err)
			}
			if info.rows != int(rows[i]) {
				return nil, fmt.Errorf("%w: decoding batches: data batch %d: tensor %q has %d rows, its request %d", ErrShape, i, t.Name, info.rows, rows[i])
			}
		}
	}
	for j, p := range parities {
		if p == nil {
			continue
		}
		if err := CheckParityShape(tmpl, p, maxRows); err != nil {
			return nil, fmt.Errorf("decoding batches: parity batch %d: %w", j, err)
		}
	}

	result := make([][]*hamsv1.Tensor, len(missing))
	for b := range result {
		result[b] = make([]*hamsv1.Tensor, len(tmpl))
	}
	data := make([][]float32, code.K)
	pdata := make([][]float32, code.R)
	recon := make([][]float32, len(missing))
	rowOut := make([][]float32, code.K)
	rowPar := make([][]float32, code.R)
	rowDst := make([][]float32, 0, len(missing))
	for ti, t := range tmpl {
		w := infos[ti].width
		var err error
		for i, o := range outputs {
			data[i] = nil
			if o == nil {
				continue
			}
			if data[i], err = tensor.Float32(findBatchTensor(o, t.Name, ti)); err != nil {
				return nil, fmt.Errorf("%w: decoding batches: data batch %d: %w", ErrShape, i, err)
			}
		}
		for j, p := range parities {
			pdata[j] = nil
			if p == nil {
				continue
			}
			if pdata[j], err = tensor.Float32(findBatchTensor(p, t.Name, ti)); err != nil {
				return nil, fmt.Errorf("%w: decoding batches: parity batch %d: %w", ErrShape, j, err)
			}
		}
		for b, i := range missing {
			recon[b] = make([]float32, int(rows[i])*w)
		}
		zero := make([]float32, w) // a padding row
		for q := range int(maxRows) {
			if w == 0 {
				break // rows of no values: nothing to reconstruct
			}
			// Invariant: rowOut[i] is row q of data batch i, zero when the
			// batch is shorter (padding, present or not), nil when it is
			// missing and has row q; rowDst lists, in increasing position
			// order, where the nil ones go.
			rowDst = rowDst[:0]
			for i := range rowOut {
				switch {
				case q >= int(rows[i]):
					rowOut[i] = zero
				case data[i] != nil:
					rowOut[i] = data[i][q*w : (q+1)*w]
				default:
					rowOut[i] = nil
				}
			}
			for b, i := range missing {
				if q < int(rows[i]) {
					rowDst = append(rowDst, recon[b][q*w:(q+1)*w])
				}
			}
			for j := range rowPar {
				rowPar[j] = nil
				if pdata[j] != nil {
					rowPar[j] = pdata[j][q*w : (q+1)*w]
				}
			}
			if err := dec.Reconstruct(rowDst, rowOut, rowPar); err != nil {
				return nil, fmt.Errorf("decoding batches: tensor %q row %d: %w", t.Name, q, err)
			}
		}
		for b, i := range missing {
			shape := append([]int64{int64(rows[i])}, infos[ti].trailing...)
			result[b][ti] = tensor.FromFloat32(t.Name, shape, recon[b])
		}
	}
	return result, nil
}
