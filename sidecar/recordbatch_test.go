package sidecar

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// writeCounter is a connection that keeps what is written and counts the
// writes.
type writeCounter struct {
	net.Conn
	buf    bytes.Buffer
	writes int
}

func (w *writeCounter) Write(p []byte) (int, error) {
	w.writes++
	return w.buf.Write(p)
}

// Between start and end the records TLS writes leave in one write per
// bulkWriteBytes, in order; outside (the handshake) each write goes
// straight through; a nil batcher is a no-op.
func TestRecordBatcherGathersWrites(t *testing.T) {
	wc := &writeCounter{}
	rb := &recordBatcher{Conn: wc}
	if _, err := rb.Write([]byte("hello")); err != nil || wc.writes != 1 {
		t.Fatalf("outside a batch: %d writes, %v", wc.writes, err)
	}
	var want bytes.Buffer
	want.WriteString("hello")
	rb.start()
	record := make([]byte, 16<<10+22)
	for i := range 100 { // 1.6 MB: more than one buffer
		record[0] = byte(i)
		if _, err := rb.Write(record); err != nil {
			t.Fatal(err)
		}
		want.Write(record)
	}
	big := bytes.Repeat([]byte{7}, 3*bulkWriteBytes) // larger than the buffer
	if _, err := rb.Write(big); err != nil {
		t.Fatal(err)
	}
	want.Write(big)
	if err := rb.end(); err != nil {
		t.Fatal(err)
	}
	if wc.writes != 1+3 || !bytes.Equal(wc.buf.Bytes(), want.Bytes()) {
		t.Fatalf("%d writes (want 4: one unbatched, two buffers, one oversized), bytes in order: %v", wc.writes, bytes.Equal(wc.buf.Bytes(), want.Bytes()))
	}
	if _, err := rb.Write([]byte("after")); err != nil || wc.writes != 5 {
		t.Fatalf("after end: %d writes, %v", wc.writes, err)
	}
	var none *recordBatcher
	none.start()
	if err := none.end(); err != nil {
		t.Fatal(err)
	}
}

// A readBatcher reads what its connection carries, in order.
func TestReadBatcherReads(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	data := bytes.Repeat([]byte("0123456789"), 300_000)
	go func() {
		_, _ = a.Write(data)
		_ = a.Close()
	}()
	got, err := io.ReadAll(newReadBatcher(b))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d of %d bytes, equal %v, %v", len(got), len(data), bytes.Equal(got, data), err)
	}
}
