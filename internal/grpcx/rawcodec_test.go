package grpcx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// RawCodec sends and receives messages as the bytes they are on the wire
// (a *[]byte): a client that can put anything on the wire.
type RawCodec struct{}

func (RawCodec) Name() string { return "proto" }

func (RawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("raw codec: %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
}

func (RawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: %T", v)
	}
	*b = data.Materialize()
	return nil
}

type predictStub struct {
	hamsv1.UnimplementedFrontendServer
	calls int
}

func (p *predictStub) Predict(_ context.Context, r *hamsv1.PredictRequest) (*hamsv1.PredictResponse, error) {
	p.calls++
	return &hamsv1.PredictResponse{Service: r.GetService()}, nil
}

type forwardStub struct {
	hamsv1.UnimplementedDataplaneServer
	batches int
}

func (f *forwardStub) Forward(s hamsv1.Dataplane_ForwardServer) error {
	for {
		b, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		f.batches++
		if err := s.Send(&hamsv1.ForwardAck{MaxInOrder: uint64(len(b.GetItems()))}); err != nil {
			return err
		}
	}
}

// TestUndecodableRequestIsInvalidArgument: a malformed protobuf message
// or a string field with invalid UTF-8 is answered InvalidArgument (grpc-go
// alone answers Internal), on a unary and a streaming method, and never
// reaches the handler; a well-formed message still works.
func TestUndecodableRequestIsInvalidArgument(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(ServerOptions(slog.New(slog.DiscardHandler), NewServerMetrics(nil), 0)...)
	ps, fs := &predictStub{}, &forwardStub{}
	hamsv1.RegisterFrontendServer(srv, ps)
	hamsv1.RegisterDataplaneServer(srv, fs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, srv, lis, time.Second) }()
	defer func() { cancel(); <-done }()
	cc, err := Dial(lis.Addr().String(), 0, grpc.WithDefaultCallOptions(grpc.ForceCodecV2(RawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()

	cases := map[string][]byte{
		"truncated varint":   {0x08},
		"bad wire type":      {0x0f, 0x01},
		"length overrun":     {0x0a, 0x7f, 'x'},
		"invalid UTF-8 name": {0x0a, 0x02, 0xff, 0xfe}, // PredictRequest.service = "\xff\xfe"
	}
	for name, msg := range cases {
		var out []byte
		err := cc.Invoke(ctx, "/hams.v1.Frontend/Predict", &msg, &out)
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "/hams.v1.Frontend/Predict: malformed request message") {
			t.Errorf("unary, %s: got %v %q, want InvalidArgument naming the method", name, st.Code(), st.Message())
		}
		if name == "invalid UTF-8 name" && !strings.Contains(st.Message(), "UTF-8") {
			t.Errorf("unary, %s: %q does not say UTF-8", name, st.Message())
		}
		// Stream: ForwardBatch.from_model is field 1 as well.
		s, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/hams.v1.Dataplane/Forward")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SendMsg(&msg); err != nil {
			t.Fatal(err)
		}
		err = s.RecvMsg(&out)
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "/hams.v1.Dataplane/Forward: malformed request message") {
			t.Errorf("stream, %s: got %v %q, want InvalidArgument naming the method", name, st.Code(), st.Message())
		}
	}
	if ps.calls != 0 || fs.batches != 0 {
		t.Fatalf("handlers saw %d predicts and %d batches of malformed messages", ps.calls, fs.batches)
	}
	good := []byte{0x0a, 0x02, 'o', 'k'}
	var out []byte
	if err := cc.Invoke(ctx, "/hams.v1.Frontend/Predict", &good, &out); err != nil {
		t.Fatalf("well-formed request: %v", err)
	}
	if want := []byte{0x0a, 0x02, 'o', 'k'}; string(out) != string(want) {
		t.Fatalf("reply %x, want %x", out, want)
	}
}
