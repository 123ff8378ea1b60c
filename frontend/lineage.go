package frontend

import (
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/protocol/lineage"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// addSink records in flow that sink model from delivered its item to the
// frontend: the pair from -> frontend gets from's seq in the item's
// lineage.
func addSink(flow *lineage.Flow, from string, lin []*hamsv1.LineageEntry) {
	var seq uint64
	for _, e := range lin {
		if e.GetModel() == from {
			seq = max(seq, e.GetSeq())
		}
	}
	if seq != 0 {
		flow.AddPair(from, config.Frontend, seq)
	}
}

// maxOrphans bounds the sink items kept for requests that are not pending.
const maxOrphans = 4096

// orphans keeps the most recent sink items that arrived for a request not
// in the table: items resent to a frontend that is about to take over a
// request (it injects the request after the items arrive), or re-executed
// items that overtook the rollback of the held reply they replace. Bounded
// FIFO; pure.
type orphans struct {
	byID map[uint64][]orphan
	fifo []uint64
}

type orphan struct {
	from string
	it   *hamsv1.Item
}

func newOrphans() *orphans { return &orphans{byID: map[uint64][]orphan{}} }

func (o *orphans) add(from string, it *hamsv1.Item) {
	o.byID[it.GetReqId()] = append(o.byID[it.GetReqId()], orphan{from, it})
	o.fifo = append(o.fifo, it.GetReqId())
	for len(o.fifo) > maxOrphans {
		id := o.fifo[0]
		o.fifo = o.fifo[1:]
		if l := o.byID[id]; len(l) > 1 {
			o.byID[id] = l[1:]
		} else {
			delete(o.byID, id)
		}
	}
}

// take removes and returns the items kept for reqID, oldest first.
func (o *orphans) take(reqID uint64) []orphan {
	l := o.byID[reqID]
	delete(o.byID, reqID)
	return l
}
