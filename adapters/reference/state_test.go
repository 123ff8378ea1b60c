package reference

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/sidecar"
)

// stateRuntime serves a 3 MiB + 8 byte state (two FP32 tensors) in 1 MiB
// chunks; corrupt breaks the stream in one of several ways.
type stateRuntime struct {
	fakeRuntime
	mu      sync.Mutex
	a, b    []byte
	version uint64
	corrupt string
	written []byte
	wver    uint64
	updated uint64
	// gap: the server's pause before each data chunk of ReadState (a
	// slow stream); stallAt: before data chunk stallAt (1-based) it
	// pauses stall instead.
	gap     time.Duration
	stallAt int
	stall   time.Duration
}

func (s *stateRuntime) specs() []*hamsv1.TensorSpec {
	return []*hamsv1.TensorSpec{{Name: "a", Datatype: "FP32", Shape: []int64{int64(len(s.a) / 4)}}, {Name: "b", Datatype: "FP32", Shape: []int64{2}}}
}

func (s *stateRuntime) Compute(_ context.Context, r *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	return &hamsv1.BatchResponse{Outputs: r.Inputs, Rows: r.Rows, BatchId: r.BatchId, NextStateVersion: s.version + 1}, nil
}

func (s *stateRuntime) Update(_ context.Context, r *hamsv1.UpdateRequest) (*hamsv1.UpdateResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.updated = r.BatchId
	return &hamsv1.UpdateResponse{StateVersion: r.BatchId}, nil
}

func (s *stateRuntime) ReadState(r *hamsv1.ReadStateRequest, st hamsv1.ModelRuntime_ReadStateServer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	data := append(append([]byte(nil), s.a...), s.b...)
	sum := sha256.Sum256(data)
	total := uint64(len(data))
	if s.corrupt == "total" {
		total++
	}
	if err := st.Send(&hamsv1.StateChunk{Model: r.Model, StateVersion: s.version, Tensors: s.specs(), TotalBytes: total}); err != nil {
		return err
	}
	size := int(r.ChunkBytes)
	for off, n := 0, 1; off < len(data); off, n = off+size, n+1 {
		pause := s.gap
		if n == s.stallAt {
			pause = s.stall
		}
		select {
		case <-time.After(pause): // the slow server
		case <-st.Context().Done():
			return st.Context().Err()
		}
		end := min(off+size, len(data))
		ch := &hamsv1.StateChunk{Offset: uint64(off), Data: data[off:end]}
		if s.corrupt == "offset" && off > 0 {
			ch.Offset++
		}
		if end == len(data) {
			if s.corrupt == "nolast" {
				return st.Send(ch)
			}
			ch.Last, ch.Sha256 = true, hex.EncodeToString(sum[:])
			if s.corrupt == "sha" {
				ch.Sha256 = "00"
			}
		}
		if err := st.Send(ch); err != nil {
			return err
		}
	}
	return nil
}

func (s *stateRuntime) WriteState(st hamsv1.ModelRuntime_WriteStateServer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var data []byte
	var sum string
	for {
		ch, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if ch.Model != "" {
			s.wver = ch.StateVersion
		}
		if ch.Offset != uint64(len(data)) && len(ch.Data) > 0 {
			return status.Error(codes.InvalidArgument, "offset")
		}
		data = append(data, ch.Data...)
		if ch.Last {
			sum = ch.Sha256
		}
	}
	h := sha256.Sum256(data)
	if hex.EncodeToString(h[:]) != sum {
		return status.Error(codes.InvalidArgument, "sha256")
	}
	s.written = data
	return st.SendAndClose(&hamsv1.WriteStateResponse{StateVersion: s.wver, Sha256: sum})
}

func (s *stateRuntime) get(p *uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return *p
}

func TestStatefulCalls(t *testing.T) {
	rt := &stateRuntime{a: make([]byte, 3<<20), b: []byte{1, 2, 3, 4, 5, 6, 7, 8}, version: 7}
	for i := range rt.a {
		rt.a[i] = byte(i * 7)
	}
	rt.ready = true
	b := New(startRuntime(t, rt), "m", 5*time.Second)
	ctx := context.Background()
	if resp, err := b.Compute(ctx, &hamsv1.BatchRequest{Rows: []uint32{1}, BatchId: 3}); err != nil || resp.BatchId != 3 {
		t.Fatalf("compute: %v %v", resp, err)
	}
	if err := b.Update(ctx, 3); err != nil || rt.get(&rt.updated) != 3 {
		t.Fatalf("update: %v (%d)", err, rt.updated)
	}
	ts, v, err := b.ReadState(ctx)
	if err != nil || v != 7 || len(ts) != 2 || len(ts[0].Data) != 3<<20 || string(ts[1].Data) != string(rt.b) || ts[0].Data[5] != rt.a[5] {
		t.Fatalf("read state: %d tensors, version %d, %v", len(ts), v, err)
	}
	err = b.WriteState(ctx, ts, 9)
	rt.mu.Lock()
	if err != nil || rt.wver != 9 || len(rt.written) != 3<<20+8 || rt.written[3<<20] != 1 {
		t.Fatalf("write state: %v (version %d, %d bytes)", err, rt.wver, len(rt.written))
	}
	rt.mu.Unlock()
	for _, c := range []string{"total", "offset", "nolast", "sha"} {
		rt.mu.Lock()
		rt.corrupt = c
		rt.mu.Unlock()
		if _, _, err := b.ReadState(ctx); status.Code(err) != codes.DataLoss {
			t.Fatalf("corrupt %s: %v", c, err)
		}
	}
}

var _ sidecar.StatefulBackend = (*Backend)(nil)

// A state stream is bounded by the time between two chunks, not by the
// whole transfer: a large state on a busy host streams for longer than the
// per-call timeout and must still arrive (every read of a 512 MiB state
// failed, for good, with the bound on the total), while a stream that
// stops moving still ends after one timeout.
func TestStateStreamBoundedByIdleTime(t *testing.T) {
	const timeout = 400 * time.Millisecond
	rt := &stateRuntime{a: make([]byte, 3<<20), b: []byte{1, 2, 3, 4, 5, 6, 7, 8}, version: 7, gap: 150 * time.Millisecond}
	rt.ready = true
	b := New(startRuntime(t, rt), "m", timeout)
	start := time.Now()
	ts, _, err := b.ReadState(context.Background())
	if err != nil || len(ts) != 2 {
		t.Fatalf("slow but moving stream (4 chunks, %v apart, timeout %v): %v", rt.gap, timeout, err)
	}
	if took := time.Since(start); took <= timeout {
		t.Fatalf("the stream took %v, not longer than the timeout %v: the test shows nothing", took, timeout)
	}
	rt.mu.Lock()
	rt.stallAt, rt.stall = 2, 5*time.Second
	rt.mu.Unlock()
	start = time.Now()
	_, _, err = b.ReadState(context.Background())
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "no chunk moved") {
		t.Fatalf("stalled stream: %v, want DeadlineExceeded naming the idle bound", err)
	}
	if took := time.Since(start); took >= rt.stall {
		t.Fatalf("the stalled stream ended after %v, not at the idle bound", took)
	}
}
