package hamsmd

import (
	"bytes"
	"context"
	"encoding/base64"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

func calls(n, lineage int) []*hamsv1.CallLineage {
	out := make([]*hamsv1.CallLineage, n)
	for i := range out {
		c := &hamsv1.CallLineage{ReqId: uint64(1000 + i), Service: "svc", StreamId: "s" + strings.Repeat("x", i%3), Model: "m"}
		for d := range lineage {
			c.Lineage = append(c.Lineage, &hamsv1.LineageEntry{PredModel: "p", PredSeq: uint64(i), Model: "q", Seq: uint64(d)})
		}
		out[i] = c
	}
	return out
}

// recorder is a TF Serving PredictionService that records the metadata of
// every call.
type recorder struct {
	tfapis.UnimplementedPredictionServiceServer
	mu  sync.Mutex
	mds map[string]metadata.MD // by method
}

func (r *recorder) note(ctx context.Context, method string) {
	md, _ := metadata.FromIncomingContext(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mds[method] = md
}

func (r *recorder) Predict(ctx context.Context, _ *tfapis.PredictRequest) (*tfapis.PredictResponse, error) {
	r.note(ctx, "Predict")
	return &tfapis.PredictResponse{}, nil
}

func (r *recorder) GetModelMetadata(ctx context.Context, _ *tfapis.GetModelMetadataRequest) (*tfapis.GetModelMetadataResponse, error) {
	r.note(ctx, "GetModelMetadata")
	return &tfapis.GetModelMetadataResponse{}, nil
}

type fixedSource []*hamsv1.CallLineage

func (f fixedSource) BatchLineage() []*hamsv1.CallLineage { return f }

// TestInterceptorOverGRPC: a batch method called with a Source on the
// context carries every request's req_id and lineage through a real gRPC
// connection (binary metadata survives the wire); a non-batch method and
// a call without a Source carry nothing.
func TestInterceptorOverGRPC(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{mds: map[string]metadata.MD{}}
	srv := grpc.NewServer()
	tfapis.RegisterPredictionServiceServer(srv, rec)
	go srv.Serve(lis)
	defer srv.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(UnaryClientInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := tfapis.NewPredictionServiceClient(cc)
	want := calls(3, 4)
	ctx := WithSource(context.Background(), fixedSource(want))
	if _, err := c.Predict(ctx, &tfapis.PredictRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{}); err != nil {
		t.Fatal(err)
	}
	got, err := FromMD(rec.mds["Predict"])
	if err != nil || got == nil {
		t.Fatalf("decode: %v %v", got, err)
	}
	if len(got.ReqIDs) != 3 || got.ReqIDs[0] != 1000 || got.ReqIDs[2] != 1002 || got.Truncated != 0 || len(got.Lineages) != 3 {
		t.Fatalf("decoded %+v", got)
	}
	for i := range want {
		if !proto.Equal(got.Lineages[i], want[i]) {
			t.Fatalf("lineage %d: %v, want %v", i, got.Lineages[i], want[i])
		}
	}
	if c, _ := FromMD(rec.mds["GetModelMetadata"]); c != nil {
		t.Fatalf("a non-batch method carried identity %+v", c)
	}
	if _, err := c.Predict(context.Background(), &tfapis.PredictRequest{}); err != nil {
		t.Fatal(err)
	}
	if c, _ := FromMD(rec.mds["Predict"]); c != nil {
		t.Fatalf("a call without a Source carried identity %+v", c)
	}
}

// TestBudget: long lineages are dropped before req_ids, and the number of
// requests not listed is said.
func TestBudget(t *testing.T) {
	cs := calls(64, 6)
	ctx := AppendOutgoing(context.Background(), cs, DefaultBudget)
	md, _ := metadata.FromOutgoingContext(ctx)
	size := 0
	for _, v := range md.Get(KeyReqID) {
		size += len(v)
	}
	for _, v := range md.Get(KeyLineage) {
		size += base64.RawStdEncoding.EncodedLen(len(v))
	}
	if size > DefaultBudget {
		t.Fatalf("values of %d bytes over the budget", size)
	}
	got, err := FromMD(md)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.ReqIDs) != 64 || len(got.Lineages) == 0 || len(got.Lineages) == 64 || got.Truncated != 64-len(got.Lineages) {
		t.Fatalf("req_ids %d lineages %d truncated %d", len(got.ReqIDs), len(got.Lineages), got.Truncated)
	}
	// A budget too small for every req_id lists a prefix of them.
	got, _ = FromMD(mdOf(AppendOutgoing(context.Background(), cs, 20)))
	if len(got.ReqIDs) != 5 || len(got.Lineages) != 0 || got.Truncated != 59 {
		t.Fatalf("tiny budget: %+v", got)
	}
}

func mdOf(ctx context.Context) metadata.MD {
	md, _ := metadata.FromOutgoingContext(ctx)
	return md
}

func TestHTTPHeaders(t *testing.T) {
	h := http.Header{}
	cs := calls(2, 3)
	SetHeaders(h, cs, DefaultBudget)
	got, err := FromHeaders(h)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.ReqIDs) != 2 || len(got.Lineages) != 2 || !proto.Equal(got.Lineages[1], cs[1]) {
		t.Fatalf("decoded %+v", got)
	}
	if c, err := FromHeaders(http.Header{}); c != nil || err != nil {
		t.Fatalf("empty headers: %v %v", c, err)
	}
}

func TestForwardable(t *testing.T) {
	md := metadata.MD{":authority": {"x"}, "content-type": {"application/grpc"}, "user-agent": {"ua"}, "grpc-timeout": {"1S"},
		"hams-req-id": {"7"}, "hams-lineage-bin": {"zz"}, "authorization": {"Bearer t"}, "x-trace-bin": {"\x01"}}
	got := Forwardable(md)
	if len(got) != 2 || got["authorization"][0] != "Bearer t" || got["x-trace-bin"][0] != "\x01" {
		t.Fatalf("forwardable %v", got)
	}
}

func TestLineageDropsDigests(t *testing.T) {
	in := []*hamsv1.LineageEntry{{PredModel: "frontend", PredSeq: 3, Model: "a", Seq: 9, OutputDigest: strings.Repeat("f", 64)}}
	out := Lineage(in)
	if len(out) != 1 || out[0].GetOutputDigest() != "" || out[0].GetSeq() != 9 || out[0].GetPredSeq() != 3 || in[0].GetOutputDigest() == "" {
		t.Fatalf("Lineage %v (input %v)", out, in)
	}
}

// TestCallLineageWire pins hams.v1.CallLineage's field numbers and wire
// types (what backends and proxies in other languages decode from
// hams-lineage-bin): req_id 1 varint, service 2, stream_id 3, model 4,
// lineage 5 (LineageEntry: pred_model 1, pred_seq 2, model 3, seq 4).
func TestCallLineageWire(t *testing.T) {
	var e []byte
	e = protowire.AppendTag(e, 1, protowire.BytesType)
	e = protowire.AppendString(e, "frontend")
	e = protowire.AppendTag(e, 2, protowire.VarintType)
	e = protowire.AppendVarint(e, 7)
	e = protowire.AppendTag(e, 3, protowire.BytesType)
	e = protowire.AppendString(e, "a")
	e = protowire.AppendTag(e, 4, protowire.VarintType)
	e = protowire.AppendVarint(e, 3)
	var want []byte
	want = protowire.AppendTag(want, 1, protowire.VarintType)
	want = protowire.AppendVarint(want, 7)
	want = protowire.AppendTag(want, 2, protowire.BytesType)
	want = protowire.AppendString(want, "svc")
	want = protowire.AppendTag(want, 3, protowire.BytesType)
	want = protowire.AppendString(want, "st")
	want = protowire.AppendTag(want, 4, protowire.BytesType)
	want = protowire.AppendString(want, "b")
	want = protowire.AppendTag(want, 5, protowire.BytesType)
	want = protowire.AppendBytes(want, e)
	got, err := proto.MarshalOptions{Deterministic: true}.Marshal(&hamsv1.CallLineage{ReqId: 7, Service: "svc", StreamId: "st", Model: "b",
		Lineage: []*hamsv1.LineageEntry{{PredModel: "frontend", PredSeq: 7, Model: "a", Seq: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("wire bytes\n got %x\nwant %x", got, want)
	}
}
