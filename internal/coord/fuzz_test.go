package coord

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// FuzzRequestRecord reads arbitrary request-log and reply records (the
// headers and data anyone who can write the streams can put there) and
// chunk lists: no panic; an error wraps ErrBadRecord; a record read
// encodes back to one that reads the same (decode(encode(x)) == x); a
// chunk list read is increasing and within its bound.
func FuzzRequestRecord(f *testing.F) {
	req := &LoggedRequest{ReqID: 7, Frontend: "fe", Deadline: time.Unix(0, 1700000000000000000),
		Request: &hamsv1.PredictRequest{Service: "s", RequestId: "r", Inputs: []*hamsv1.Tensor{{Name: "x", Datatype: "UINT8", Shape: []int64{1}, Data: []byte{1}}}}}
	h, b, _ := encodeRequest(req, req.Deadline.Add(-5*time.Second))
	f.Add(h.Get(hdrReqID), h.Get(hdrFrontend), h.Get(hdrTimeout), "", "", "3,9,27", b)
	f.Add(h.Get(hdrReqID), h.Get(hdrFrontend), "L"+h.Get(hdrDeadline), "", "", "", b)
	h, b, _ = encodeReply(&LoggedReply{ReqID: 7, Frontend: "fe", Response: &hamsv1.PredictResponse{ReqId: 7}})
	f.Add(h.Get(hdrReqID), "fe", "", "", "", "", b)
	f.Add("8", "fe", "", "3", "bad input", "1,1", []byte{})
	f.Add("x", "", "soon", "-3", "", "9,x", []byte{0x0a, 0x7f})
	f.Fuzz(func(t *testing.T, id, fe, deadline, code, msg, chunks string, data []byte) {
		h := nats.Header{}
		// deadline is the time left (Hams-Timeout), or with a leading
		// "L" the absolute deadline of an earlier version's record.
		timeHdr := hdrTimeout
		if rest, ok := strings.CutPrefix(deadline, "L"); ok {
			timeHdr, deadline = hdrDeadline, rest
		}
		for k, v := range map[string]string{hdrReqID: id, hdrFrontend: fe, timeHdr: deadline, hdrCode: code, hdrError: msg} {
			if v != "" {
				h.Set(k, v)
			}
		}
		bad := func(what string, err error) {
			t.Helper()
			if err != nil && !errors.Is(err, ErrBadRecord) {
				t.Fatalf("%s: error %v does not wrap ErrBadRecord", what, err)
			}
		}
		written := time.Unix(0, 1700000000000000000)
		if r, err := decodeRequest(h, data, 5, written); err == nil {
			if left := r.Deadline.Sub(written); h.Get(hdrTimeout) != "" && (left > maxRecordTimeout || left < -maxRecordTimeout) {
				t.Fatalf("time left %v outside ±%v", left, maxRecordTimeout)
			}
			h2, b2, err := encodeRequest(r, written)
			if err != nil {
				t.Fatal(err)
			}
			back, err := decodeRequest(h2, b2, 5, written)
			want := written.Add(clampTimeout(r.Deadline.Sub(written)))
			if err != nil || back.ReqID != r.ReqID || back.Frontend != r.Frontend || !back.Deadline.Equal(want) || !proto.Equal(back.Request, r.Request) {
				t.Fatalf("request decode(encode(x)) = %+v %v, want %+v", back, err, r)
			}
		} else {
			bad("decodeRequest", err)
		}
		if r, err := decodeReply(h, data); err == nil {
			if r.Code != codes.OK && (r.Code <= 0 || r.Code > codes.Unauthenticated) {
				t.Fatalf("reply code %d", r.Code)
			}
			h2, b2, err := encodeReply(r)
			if err != nil {
				t.Fatal(err)
			}
			back, err := decodeReply(h2, b2)
			if err != nil || back.ReqID != r.ReqID || back.Code != r.Code || back.Error != r.Error || !proto.Equal(back.Response, r.Response) {
				t.Fatalf("reply decode(encode(x)) = %+v %v, want %+v", back, err, r)
			}
		} else {
			bad("decodeReply", err)
		}
		if chunks != "" {
			seqs, err := parseChunks(chunks, 64)
			bad("parseChunks", err)
			if err == nil {
				if len(seqs) > 64 {
					t.Fatalf("%d chunks over the bound of 64", len(seqs))
				}
				for i := 1; i < len(seqs); i++ {
					if seqs[i] <= seqs[i-1] {
						t.Fatalf("chunk list %q read as %v", chunks, seqs)
					}
				}
			}
		}
	})
}

// FuzzCheckpoint reads arbitrary bytes as a replay checkpoint object: no
// panic, a clean error or a checkpoint whose state is what its header
// says (size, digest, tensors), and nothing allocated beyond the object's
// size.
func FuzzCheckpoint(f *testing.F) {
	state := []byte("0123456789abcdef")
	sum := sha256.Sum256(state)
	ck := &hamsv1.ReplayCheckpoint{Model: "m", Epoch: 2, BatchId: 9, StateBytes: uint64(len(state)),
		StateTensors: []*hamsv1.TensorSpec{{Name: "s", Datatype: "FP32", Shape: []int64{4}}},
		StateDigest:  hex.EncodeToString(sum[:])}
	head, _ := proto.Marshal(ck)
	obj := append(append(binary.AppendUvarint(nil, uint64(len(head))), head...), state...)
	f.Add(obj)
	if _, _, err := decodeCheckpoint("m/1", bytes.NewReader(obj), uint64(len(obj))); err != nil {
		f.Fatalf("seed checkpoint: %v", err)
	}
	f.Add(binary.AppendUvarint(nil, 1<<40))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, obj []byte) {
		ck, state, err := decodeCheckpoint("m/1", bytes.NewReader(obj), uint64(len(obj)))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "coord: checkpoint m/1: ") {
				t.Fatalf("error %q does not name the checkpoint", err)
			}
			return
		}
		var n uint64
		for _, s := range state {
			n += uint64(len(s.GetData()))
		}
		if n != ck.GetStateBytes() || n > uint64(len(obj)) {
			t.Fatalf("state of %d bytes, header says %d, object %d", n, ck.GetStateBytes(), len(obj))
		}
	})
}
