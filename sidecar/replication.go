package sidecar

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// replicationServer serves hamsv1.Replication on the sidecar's gRPC
// server: ShipSnapshot and GetMaxSeq on a backup; the recovery RPCs are
// not implemented yet.
type replicationServer struct {
	hamsv1.UnimplementedReplicationServer
	s *Sidecar
}

func (r *replicationServer) notBackup(rpc string) error {
	return status.Errorf(codes.FailedPrecondition, "%s: %s is the %s sidecar of %q, not a backup", rpc, r.s.cfg.GRPCListener.Addr(), r.s.role, r.s.cfg.Model)
}

func (r *replicationServer) ShipSnapshot(stream hamsv1.Replication_ShipSnapshotServer) error {
	if r.s.bk == nil {
		return r.notBackup("ShipSnapshot")
	}
	return r.s.bk.shipSnapshot(stream)
}

func (r *replicationServer) GetMaxSeq(_ context.Context, req *hamsv1.GetMaxSeqRequest) (*hamsv1.GetMaxSeqResponse, error) {
	if r.s.bk == nil {
		return nil, r.notBackup("GetMaxSeq")
	}
	if m := req.GetModel(); m != "" && m != r.s.cfg.Model {
		return nil, status.Errorf(codes.NotFound, "GetMaxSeq: this is the backup of %q, not %q", r.s.cfg.Model, m)
	}
	seq, batch := r.s.bk.MaxSeq()
	return &hamsv1.GetMaxSeqResponse{MaxSeq: seq, BatchId: batch}, nil
}

func unimplemented(rpc string) error {
	return status.Errorf(codes.Unimplemented, "Replication.%s is not implemented yet: it comes with %s", rpc, recoveryIssue)
}

func (r *replicationServer) GetLineageSummary(context.Context, *hamsv1.LineageSummaryRequest) (*hamsv1.LineageSummary, error) {
	return nil, unimplemented("GetLineageSummary")
}

func (r *replicationServer) Resend(context.Context, *hamsv1.ResendRequest) (*hamsv1.ResendResponse, error) {
	return nil, unimplemented("Resend")
}

func (r *replicationServer) Promote(context.Context, *hamsv1.PromoteRequest) (*hamsv1.PromoteResponse, error) {
	return nil, unimplemented("Promote")
}

func (r *replicationServer) Demote(context.Context, *hamsv1.DemoteRequest) (*hamsv1.DemoteResponse, error) {
	return nil, unimplemented("Demote")
}

func (r *replicationServer) Rollback(context.Context, *hamsv1.RollbackRequest) (*hamsv1.RollbackResponse, error) {
	return nil, unimplemented("Rollback")
}
