package coord

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// The numbers behind the state-shipping choice (docs/measurements.md): how
// fast can one state of 64 MiB move primary -> backup through (a) JetStream
// messages of 1 MiB (the default max payload), (b) the JetStream object
// store, (c) a gRPC client stream of 1 MiB chunks sidecar-to-sidecar, against
// (d) a plain memcpy, and (e) a plain TCP connection (the sidecars' bulk
// stream). Run: go test -run - -bench Ship -benchtime 5x ./internal/coord/
const shipBytes = 64 << 20
const shipChunk = 1 << 20

func BenchmarkShipMemcpy(b *testing.B) {
	src := bytes.Repeat([]byte{7}, shipBytes)
	dst := make([]byte, shipBytes)
	b.SetBytes(shipBytes)
	for i := 0; i < b.N; i++ {
		copy(dst, src)
	}
}

func BenchmarkShipJetStreamChunks(b *testing.B) {
	nc := embedded(b)
	ctx := context.Background()
	js, _ := jetstream.New(nc)
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "SHIP", Subjects: []string{"ship.>"}, Storage: jetstream.FileStorage, MaxMsgsPerSubject: 128})
	if err != nil {
		b.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{7}, shipChunk)
	b.SetBytes(shipBytes)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		futs := make([]jetstream.PubAckFuture, 0, shipBytes/shipChunk)
		for off := 0; off < shipBytes; off += shipChunk {
			f, err := js.PublishAsync(fmt.Sprintf("ship.%d", off/shipChunk), chunk)
			if err != nil {
				b.Fatal(err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkShipJetStreamObjectStore(b *testing.B) {
	nc := embedded(b)
	ctx := context.Background()
	js, _ := jetstream.New(nc)
	os, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "state", Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	data := bytes.Repeat([]byte{7}, shipBytes)
	b.SetBytes(shipBytes)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := os.Put(ctx, jetstream.ObjectMeta{Name: "m"}, bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}

// sink is a Replication server that only drains ShipSnapshot streams.
type sink struct {
	hamsv1.UnimplementedReplicationServer
}

func (sink) ShipSnapshot(st grpc.ClientStreamingServer[hamsv1.SnapshotChunk, hamsv1.ShipSnapshotResponse]) error {
	n := 0
	for {
		c, err := st.Recv()
		if err == io.EOF {
			return st.SendAndClose(&hamsv1.ShipSnapshotResponse{BatchId: uint64(n)})
		}
		if err != nil {
			return err
		}
		n += len(c.GetData())
	}
}

func BenchmarkShipGRPCStream(b *testing.B) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(8 << 20))
	hamsv1.RegisterReplicationServer(srv, sink{})
	go srv.Serve(lis)
	defer srv.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(8<<20), grpc.WithInitialConnWindowSize(16<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	cl := hamsv1.NewReplicationClient(cc)
	chunk := bytes.Repeat([]byte{7}, shipChunk)
	b.SetBytes(shipBytes)
	b.ResetTimer()
	cpu0 := cpuNow()
	for i := 0; i < b.N; i++ {
		st, err := cl.ShipSnapshot(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		st.Send(&hamsv1.SnapshotChunk{Part: &hamsv1.SnapshotChunk_Header{Header: &hamsv1.SnapshotHeader{Model: "m", BatchId: uint64(i + 1), StateBytes: shipBytes}}})
		for off := 0; off < shipBytes; off += shipChunk {
			if err := st.Send(&hamsv1.SnapshotChunk{Part: &hamsv1.SnapshotChunk_Data{Data: chunk}}); err != nil {
				b.Fatal(err)
			}
		}
		r, err := st.CloseAndRecv()
		if err != nil || r.BatchId != shipBytes {
			b.Fatal(r, err)
		}
	}
	b.ReportMetric(cpuSince(cpu0, b.N), "cpu-ms/op")
}

// BenchmarkShipRawTCP is (e): the bytes written on a plain TCP connection
// and read straight into the receiver's state buffer, as the sidecar's
// bulk stream does (sidecar/bulk.go), one byte of acknowledgement per
// state. cpu-ms/op is the process's CPU (both ends) per state.
func BenchmarkShipRawTCP(b *testing.B) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer lis.Close()
	go func() {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, shipBytes)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write([]byte{1}); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	chunk := bytes.Repeat([]byte{7}, shipChunk)
	ack := make([]byte, 1)
	b.SetBytes(shipBytes)
	b.ResetTimer()
	cpu0 := cpuNow()
	for i := 0; i < b.N; i++ {
		for off := 0; off < shipBytes; off += shipChunk {
			if _, err := c.Write(chunk); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := io.ReadFull(c, ack); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(cpuSince(cpu0, b.N), "cpu-ms/op")
}

// cpuNow is the process's user+system CPU time.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func cpuSince(t0 time.Duration, n int) float64 {
	return float64(cpuNow()-t0) / float64(n) / 1e6
}
