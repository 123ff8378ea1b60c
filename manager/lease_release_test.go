package manager

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// answerLostKV applies Update at the server and then reports the error a
// caller sees when its context ended before the answer came back.
type answerLostKV struct {
	jetstream.KeyValue
	loseUpdate bool
}

func (k *answerLostKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	if !k.loseUpdate {
		return k.KeyValue.Update(ctx, key, value, last)
	}
	k.loseUpdate = false
	if _, err := k.KeyValue.Update(context.Background(), key, value, last); err != nil {
		return 0, err
	}
	return 0, context.Canceled
}

// A clean stop that cancels a renewal in flight, after the server applied
// it, still releases the lease (the release once failed on the revision
// and the successor waited a whole ttl); a lease another manager took is
// never deleted.
func TestLeaseReleaseAfterLostRenewal(t *testing.T) {
	s, _ := newTestStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv := &answerLostKV{KeyValue: s.kv}
	l := &lease{kv: kv, id: "m1", ttl: time.Second, log: slog.New(slog.DiscardHandler)}
	l.step(ctx, time.Now())
	if !l.active {
		t.Fatal("lease not taken on an empty bucket")
	}
	kv.loseUpdate = true
	l.step(ctx, time.Now())
	if !l.active {
		t.Fatal("a renewal with a lost answer made the holder step down at once")
	}
	e, err := s.kv.Get(ctx, LeaseKey)
	if err != nil || e.Revision() == l.rev {
		t.Fatalf("the renewal did not land past the holder's revision %d: %v, %v", l.rev, e, err)
	}
	if err := l.release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	if _, err := s.kv.Get(ctx, LeaseKey); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("lease still held after release: %v", err)
	}

	// Taken over by m2 after our renewal's answer was lost: left to m2.
	l.active = false
	l.step(ctx, time.Now())
	if !l.active {
		t.Fatal("released lease not taken again")
	}
	kv.loseUpdate = true
	l.step(ctx, time.Now())
	e, err = s.kv.Get(ctx, LeaseKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.kv.Update(ctx, LeaseKey, []byte("m2"), e.Revision()); err != nil {
		t.Fatal(err)
	}
	if err := l.release(ctx); err != nil {
		t.Fatalf("release of a lease another manager holds: %v", err)
	}
	if e, err := s.kv.Get(ctx, LeaseKey); err != nil || string(e.Value()) != "m2" {
		t.Fatalf("m2's lease after m1's release: %v, %v", e, err)
	}
}
