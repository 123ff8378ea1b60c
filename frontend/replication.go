package frontend

import (
	"context"
	"slices"
	"sort"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// replicationServer serves the recovery hooks of hamsv1.Replication that
// concern the frontend: it is the successor of the sink models
// (GetLineageSummary) and the source of the entry edges (Resend). The
// other calls are for models and answer FailedPrecondition.
type replicationServer struct {
	hamsv1.UnimplementedReplicationServer
	f *Frontend
}

var errNotAModel = status.Error(codes.FailedPrecondition, "frontend: not a model")

// GetLineageSummary: with failed_model F, max_out_seq is the highest seq of
// F in the lineage of the sink items this frontend received and
// max_in_by_pred the contiguous prefixes of every model upstream of F
// (the frontend included); consumed_beyond is always false (the frontend
// executes nothing). Without F: the frontend itself, max_in_by_pred per
// sink model.
func (s *replicationServer) GetLineageSummary(_ context.Context, req *hamsv1.LineageSummaryRequest) (*hamsv1.LineageSummary, error) {
	f := s.f
	fm := req.GetFailedModel()
	var g *config.Graph
	if fm != "" {
		for _, n := range f.svcOrder {
			if sg := f.services[n].graph; slices.Contains(sg.Models(), fm) {
				g = sg
				break
			}
		}
		if g == nil {
			return nil, status.Errorf(codes.NotFound, "GetLineageSummary: model %q is in no service of the frontend", fm)
		}
	}
	f.flowMu.Lock()
	defer f.flowMu.Unlock()
	if fm == "" {
		out := &hamsv1.LineageSummary{Model: config.Frontend, MaxInByPred: map[string]uint64{}}
		for _, n := range f.svcOrder {
			for _, sink := range f.services[n].sinks {
				out.MaxInByPred[sink] = f.flow.Contig(sink, config.Frontend)
			}
		}
		return out, nil
	}
	return &hamsv1.LineageSummary{Model: config.Frontend, MaxOutSeq: f.flow.MaxSeq(fm), MaxInByPred: f.flow.Prefixes(g, fm)}, nil
}

// Resend resends, on the entry edge to to_model, the items this frontend
// keeps (acknowledged, not yet completed) whose position (the request's
// req_id: the frontend's pred_seq in lineage) is above after_edge_seq, then the unacknowledged
// ones, to to_address at epoch.
func (s *replicationServer) Resend(_ context.Context, req *hamsv1.ResendRequest) (*hamsv1.ResendResponse, error) {
	snd := s.f.senders[req.GetToModel()]
	if snd == nil {
		return nil, status.Errorf(codes.NotFound, "Resend: %q is not an entry model of the frontend", req.GetToModel())
	}
	// The candidates are the items of the requests still unanswered (the
	// Sender's own retention also holds answered ones whose ack raced
	// their answer); the Sender appends its unacknowledged items.
	items := s.f.unansweredItems(req.GetToModel())
	n := snd.Resend(edge.ResendSpec{After: req.GetAfterEdgeSeq(), Addr: req.GetToAddress(), Epoch: req.GetEpoch(), Items: items})
	s.f.log.Info("resend on entry edge", "to", req.GetToModel(), "addr", req.GetToAddress(), "after", req.GetAfterEdgeSeq(), "epoch", req.GetEpoch(), "resent", n)
	return &hamsv1.ResendResponse{Resent: uint64(n)}, nil
}

// unansweredItems returns the items sent to entry model `to` of every
// injected request not answered yet, in req_id order (never nil).
func (f *Frontend) unansweredItems(to string) []*hamsv1.Item {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []*hamsv1.Item{}
	for _, c := range f.calls {
		svc := f.services[c.service]
		if svc == nil || len(c.items) != len(svc.entries) {
			continue
		}
		for i, e := range svc.entries {
			if e == to {
				out = append(out, c.items[i])
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetReqId() < out[j].GetReqId() })
	return out
}

func (s *replicationServer) ShipSnapshot(hamsv1.Replication_ShipSnapshotServer) error {
	return errNotAModel
}
func (s *replicationServer) GetMaxSeq(context.Context, *hamsv1.GetMaxSeqRequest) (*hamsv1.GetMaxSeqResponse, error) {
	return nil, errNotAModel
}
func (s *replicationServer) Promote(context.Context, *hamsv1.PromoteRequest) (*hamsv1.PromoteResponse, error) {
	return nil, errNotAModel
}
func (s *replicationServer) Demote(context.Context, *hamsv1.DemoteRequest) (*hamsv1.DemoteResponse, error) {
	return nil, errNotAModel
}
func (s *replicationServer) Rollback(context.Context, *hamsv1.RollbackRequest) (*hamsv1.RollbackResponse, error) {
	return nil, errNotAModel
}
