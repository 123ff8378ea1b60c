package tfserving

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/bigmem"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Compute runs the batch from the current state and stages the returned
// state as next (replacing an earlier staged one that was never updated).
// A stateless signature computes like Infer.
func (b *Backend) Compute(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	sig, err := b.signatureOf(ctx)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	cur, ver, writes := b.cur, b.curVer, b.writes
	b.mu.Unlock()
	resp, next, err := b.predict(ctx, sig, req, cur)
	if err != nil {
		return nil, err
	}
	resp.NextStateVersion = ver + 1
	if len(sig.state) == 0 {
		return resp, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.curVer != ver || b.writes != writes {
		// WriteState ran meanwhile: this batch's next state was computed
		// from a state that is gone.
		return nil, status.Errorf(codes.Aborted, "tfserving %s compute: state overwritten (version %d -> %d) while batch %d computed", b.label, ver, b.curVer, req.GetBatchId())
	}
	b.next, b.nextBatch = next, req.GetBatchId()
	return resp, nil
}

// Update makes the state staged by batch batchID's Compute current.
func (b *Backend) Update(_ context.Context, batchID uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sig == nil || len(b.sig.state) == 0 {
		b.curVer++
		return nil
	}
	if b.next == nil || b.nextBatch != batchID {
		staged := "nothing"
		if b.next != nil {
			staged = fmt.Sprintf("batch %d", b.nextBatch)
		}
		return status.Errorf(codes.FailedPrecondition, "tfserving %s update %d: %s is staged", b.label, batchID, staged)
	}
	b.cur, b.next = b.next, nil
	b.curVer++
	return nil
}

// ReadState returns the current state tensors (in the signature's state
// order, named without the "state/" prefix) and their version. The tensors
// are never modified afterwards: Update replaces them.
func (b *Backend) ReadState(ctx context.Context) ([]*hamsv1.Tensor, uint64, error) {
	if _, err := b.signatureOf(ctx); err != nil {
		return nil, 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*hamsv1.Tensor(nil), b.cur...), b.curVer, nil
}

// WriteState overwrites the current state (one tensor per state spec, in
// order, each matching its spec) and sets its version; a staged next state
// is dropped.
func (b *Backend) WriteState(ctx context.Context, tensors []*hamsv1.Tensor, version uint64) error {
	sig, err := b.signatureOf(ctx)
	if err != nil {
		return err
	}
	if len(tensors) != len(sig.state) {
		return status.Errorf(codes.InvalidArgument, "tfserving %s write state: %d tensors, the signature has %d state tensors %v", b.label, len(tensors), len(sig.state), specNames(sig.state))
	}
	cp := make([]*hamsv1.Tensor, len(tensors))
	for i, t := range tensors {
		sp := sig.state[i]
		if t.GetName() != sp.Name || t.GetDatatype() != sp.Datatype || !equalShape(t.GetShape(), sp.Shape) {
			return status.Errorf(codes.InvalidArgument, "tfserving %s write state: tensor %d is %q %s %v, want %q %s %v", b.label, i, t.GetName(), t.GetDatatype(), t.GetShape(), sp.Name, sp.Datatype, sp.Shape)
		}
		if err := tensor.Validate(t); err != nil {
			return status.Errorf(codes.InvalidArgument, "tfserving %s write state: %v", b.label, err)
		}
		cp[i] = &hamsv1.Tensor{Name: sp.Name, Datatype: sp.Datatype, Shape: sp.Shape, Data: bigmem.Clone(t.GetData())}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cur, b.curVer, b.next = cp, version, nil
	b.writes++
	return nil
}
