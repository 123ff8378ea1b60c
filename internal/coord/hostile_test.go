package coord

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// TestChunkListsAreBounded: a record's chunk list cannot make a reader
// allocate more than MaxRecordBytes, nor name one chunk twice (a small
// stream assembling into a huge record), nor name more chunks than a
// record may have; such a record is ErrBadRecord, found before the data
// is assembled.
func TestChunkListsAreBounded(t *testing.T) {
	nc := embeddedWith(t, func(o *server.Options) { o.MaxPayload = 64 << 10 })
	c := openT(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	defer func(n int) { MaxRecordBytes = n }(MaxRecordBytes)
	MaxRecordBytes = 1 << 20
	most := MaxRecordBytes/c.chunkBytes() + 1
	// Real chunks of ~56 KiB, one more than a record of MaxRecordBytes
	// needs.
	var real []string
	for range most {
		ack, err := c.js.Publish(ctx, RepliesSubject(c.deployment)+".c", bytes.Repeat([]byte{7}, c.chunkBytes()))
		if err != nil {
			t.Fatal(err)
		}
		real = append(real, strconv.FormatUint(ack.Sequence, 10))
	}
	more := make([]string, most+1)
	for i := range more {
		more[i] = strconv.Itoa(i + 1)
	}
	for id, c2 := range map[uint64]struct{ list, want string }{
		1: {strings.TrimSuffix(strings.Repeat(real[0]+",", most), ","), "in increasing order"}, // one chunk named again and again
		2: {strings.Join(more, ","), "chunks, a record has at most"},                           // refused before any is fetched
		3: {"9,x", `"x" is not a stream sequence`},
		4: {strings.Join(real, ","), "chunks of more than 1048576 bytes"}, // real chunks past the limit
	} {
		if _, err := c.js.PublishMsg(ctx, &nats.Msg{Subject: c.replySubject(id), Header: nats.Header{hdrReqID: []string{strconv.FormatUint(id, 10)}, hdrChunks: []string{c2.list}}}); err != nil {
			t.Fatal(err)
		}
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		_, err := c.LookupReply(ctx, id)
		runtime.ReadMemStats(&ms1)
		if !errors.Is(err, ErrBadRecord) || !strings.Contains(err.Error(), c2.want) {
			t.Errorf("record %d: got %v, want ErrBadRecord saying %q", id, err, c2.want)
		}
		// Records 1-3 are refused before any chunk is fetched; 4 reads
		// real chunks up to the limit (the client's copies of each
		// fetched chunk included, more under the race detector).
		most := uint64(16 << 20)
		if id == 4 {
			most = 64 << 20
		}
		if n := ms1.TotalAlloc - ms0.TotalAlloc; n > most {
			t.Errorf("record %d: %d bytes allocated", id, n)
		}
	}
	// And the writer refuses to write one.
	big := &hamsv1.PredictResponse{Outputs: []*hamsv1.ModelOutput{{Tensors: []*hamsv1.Tensor{{Data: make([]byte, 2<<20)}}}}}
	if _, err := c.RecordReply(ctx, &LoggedReply{ReqID: 5, Response: big}); err == nil || !strings.Contains(err.Error(), "record limit") {
		t.Fatalf("writing a record over MaxRecordBytes: %v", err)
	}
}

// TestWatchesSkipUnreadableRecords: a record or notice nobody can read
// (anyone who can write the stream can write one) is skipped and counted;
// the watches go on to the next one instead of ending (a restarted watch
// would meet it again, and every later request, reply or notice would be
// lost).
func TestWatchesSkipUnreadableRecords(t *testing.T) {
	nc := embedded(t)
	c := openT(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js := c.js
	// Request log: garbage first, then a good record.
	p := RequestsSubject(c.deployment)
	for _, m := range []*nats.Msg{
		{Subject: p + ".n.1", Header: nats.Header{hdrReqID: []string{"1"}, hdrDeadline: []string{"soon"}}},
		{Subject: p + ".n.2", Header: nats.Header{hdrReqID: []string{"2"}, hdrDeadline: []string{"1"}}, Data: []byte{0x0a, 0x7f}},
		{Subject: p + ".n.3", Header: nats.Header{hdrReqID: []string{"3"}, hdrDeadline: []string{"1"}, hdrChunks: []string{"5,5"}}},
	} {
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.LogRequest(ctx, &LoggedRequest{ReqID: 9, Frontend: "f", Deadline: time.Now().Add(time.Minute), Request: req("svc", "", []byte{1})}); err != nil {
		t.Fatal(err)
	}
	got := make(chan uint64, 4)
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.WatchRequests(wctx, time.Minute, func(r *LoggedRequest, _ bool) { got <- r.ReqID })
	}()
	select {
	case id := <-got:
		if id != 9 {
			t.Fatalf("watch delivered %d, want 9", id)
		}
	case err := <-done:
		t.Fatalf("request watch ended on an unreadable record: %v", err)
	case <-ctx.Done():
		t.Fatal("no request delivered")
	}
	wcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := c.BadRecords(); n != 3 {
		t.Fatalf("%d bad records counted, want 3", n)
	}
	// Durability notices: garbage on the subject (and as the last
	// message, which the catch-up reads), then a good notice.
	notes := make(chan *hamsv1.DurabilityNotice, 4)
	dctx, dcancel := context.WithCancel(ctx)
	ddone := make(chan error, 1)
	if _, err := js.Publish(ctx, DurableSubject(c.deployment, "a"), []byte{0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	go func() { ddone <- c.WatchDurable(dctx, []string{"a"}, func(n *hamsv1.DurabilityNotice) { notes <- n }) }()
	good := &hamsv1.DurabilityNotice{Model: "a", Epoch: 1, DurableSeq: 4}
	b, _ := proto.Marshal(good)
	for delivered := false; !delivered; {
		// The live subscription may start after a publish: publish until
		// the watch delivers (polling, not a wait for an event).
		if _, err := js.Publish(ctx, DurableSubject(c.deployment, "a"), []byte{0x0a, 0x7f}); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, DurableSubject(c.deployment, "a"), b); err != nil {
			t.Fatal(err)
		}
		select {
		case n := <-notes:
			if !proto.Equal(n, good) {
				t.Fatalf("notice %v", n)
			}
			delivered = true
		case err := <-ddone:
			t.Fatalf("durability watch ended on an unreadable notice: %v", err)
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("no notice delivered")
		}
	}
	dcancel()
	if err := <-ddone; err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointLengthsChecked: a checkpoint object's header length and
// state size are checked against the object's size before anything of
// that size is allocated.
func TestCheckpointLengthsChecked(t *testing.T) {
	head, _ := proto.Marshal(&hamsv1.ReplayCheckpoint{Model: "m", StateBytes: 1 << 40})
	obj := append(binary.AppendUvarint(nil, uint64(len(head))), head...)
	for name, c := range map[string]struct {
		b    []byte
		size uint64
		want string
	}{
		"huge header length": {binary.AppendUvarint(nil, 1<<40), 10, "a header of 1099511627776 bytes in an object of 10"},
		"huge state":         {obj, uint64(len(obj)), "header says 1099511627776 state bytes, the object holds 0"},
		"empty":              {nil, 0, "header length"},
		"length only":        {[]byte{0}, 0, "a header of 0 bytes in an object of 0"},
	} {
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		_, _, err := decodeCheckpoint("m/1", bytes.NewReader(c.b), c.size)
		runtime.ReadMemStats(&ms1)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error saying %q", name, err, c.want)
		}
		if n := ms1.TotalAlloc - ms0.TotalAlloc; n > 4<<20 {
			t.Errorf("%s: %d bytes allocated", name, n)
		}
	}
}
