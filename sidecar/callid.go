package sidecar

import (
	"sync"

	"github.com/hams-go/hams/internal/hamsmd"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Request identity on backend calls (internal/hamsmd). Run puts the
// sidecar's executor on its context as the hamsmd.Source; batchRequest
// notes the requests of every batch it builds; a backend connection dialled with
// hamsmd.UnaryClientInterceptor then asks BatchLineage on each call that
// runs a batch and sends the answer as hams-req-id / hams-lineage-bin
// metadata. At most one batch computes at a time (the executor runs one;
// the stateful primary starts a compute only when the last one ended), and
// batchRequest is called by the goroutine that then calls the backend, so
// the last batch noted is the one a batch call runs (retries included).

// callReq is what the identity of one request needs (no tensors, so a
// noted batch keeps no inputs alive).
type callReq struct {
	reqID           uint64
	service, stream string
	parts           []*hamsv1.Item // lineage only is read
}

// batchIdentity is a noted batch; calls is built on first use.
type batchIdentity struct {
	model string
	reqs  []callReq
	once  sync.Once
	calls []*hamsv1.CallLineage
}

// noteBatch records the requests of the batch being built.
func (x *executor) noteBatch(reqs []request) { x.callID.Store(x.identityOf(reqs)) }

// identityOf is the identity of a batch of reqs.
func (x *executor) identityOf(reqs []request) *batchIdentity {
	b := &batchIdentity{model: x.h.Model(), reqs: make([]callReq, len(reqs))}
	for i, r := range reqs {
		p0 := r.j.Parts[0]
		b.reqs[i] = callReq{reqID: r.j.ReqID, service: p0.GetService(), stream: p0.GetStreamId(), parts: lineageOnly(r.j.Parts)}
	}
	return b
}

// noteReplayed records the requests of a logged batch that replay
// re-executes, so its backend call names them and not the last live
// batch. The logged parts already carry no tensors.
func (x *executor) noteReplayed(b *hamsv1.ReplayBatch) {
	id := &batchIdentity{model: x.h.Model(), reqs: make([]callReq, len(b.GetRequests()))}
	for i, r := range b.GetRequests() {
		var service, stream string
		if ps := r.GetParts(); len(ps) > 0 {
			service, stream = ps[0].GetService(), ps[0].GetStreamId()
		}
		id.reqs[i] = callReq{reqID: r.GetReqId(), service: service, stream: stream, parts: r.GetParts()}
	}
	x.callID.Store(id)
}

// lineageOnly keeps the parts' lineage without their tensors.
func lineageOnly(parts []*hamsv1.Item) []*hamsv1.Item {
	out := make([]*hamsv1.Item, len(parts))
	for i, p := range parts {
		out[i] = &hamsv1.Item{FromModel: p.GetFromModel(), ReqId: p.GetReqId(), Lineage: p.GetLineage()}
	}
	return out
}

// BatchLineage implements hamsmd.Source: the identity of the requests of
// the last batch built, one per request in row order.
func (x *executor) BatchLineage() []*hamsv1.CallLineage {
	b := x.callID.Load()
	if b == nil {
		return nil
	}
	return b.BatchLineage()
}

// BatchLineage makes one noted batch a hamsmd.Source of its own: with
// several executors (a concurrent backend: a replica pool) "the last batch
// built" is not the one a call runs, so each call's context carries its
// own batch.
func (b *batchIdentity) BatchLineage() []*hamsv1.CallLineage {
	b.once.Do(func() {
		b.calls = make([]*hamsv1.CallLineage, len(b.reqs))
		for i, r := range b.reqs {
			b.calls[i] = &hamsv1.CallLineage{ReqId: r.reqID, Service: r.service, StreamId: r.stream, Model: b.model,
				Lineage: hamsmd.Lineage(MergeLineage(nil, r.parts))}
		}
	})
	return b.calls
}
