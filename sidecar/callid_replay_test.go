package sidecar

import (
	"testing"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/sidecar/datapath"
)

// A batch that replay re-executes is named on its backend call by its own
// logged requests (hams-req-id / hams-lineage-bin), not by the last live
// batch the sidecar built.
func TestReplayedBatchNamesItsRequests(t *testing.T) {
	s := &executor{h: &sidecarHost{cfg: &Config{Model: "b"}}}
	s.noteBatch([]request{{j: &datapath.Joined{ReqID: 99, Parts: []*hamsv1.Item{{ReqId: 99, Service: "live"}}}}})
	s.noteReplayed(&hamsv1.ReplayBatch{Model: "b", BatchId: 4, Requests: []*hamsv1.ReplayRequest{
		{ReqId: 7, Parts: []*hamsv1.Item{{ReqId: 7, FromModel: "a", Service: "svc", StreamId: "s1",
			Lineage: []*hamsv1.LineageEntry{{Model: "a", Seq: 3}}}}},
		{ReqId: 8, Parts: []*hamsv1.Item{{ReqId: 8, FromModel: "a", Service: "svc", StreamId: "s2"}}},
	}})
	calls := s.BatchLineage()
	if len(calls) != 2 || calls[0].GetReqId() != 7 || calls[1].GetReqId() != 8 || calls[0].GetStreamId() != "s1" ||
		calls[0].GetService() != "svc" || calls[0].GetModel() != "b" {
		t.Fatalf("identity of the replayed batch: %v", calls)
	}
	if len(calls[0].GetLineage()) == 0 {
		t.Fatalf("request 7's lineage is missing: %v", calls[0])
	}
}
