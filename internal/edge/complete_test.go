package edge

import (
	"testing"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// A completion that overtakes the ack of its request's item: the item is
// still delivered, but dropped instead of retained once acknowledged; the
// other requests' items are retained as usual.
func TestCompleteBeforeAck(t *testing.T) {
	s, err := NewSender(SenderConfig{From: "a", To: "b", Resolver: NewStaticResolver(nil)})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 6; i++ {
		s.Send(&hamsv1.Item{ReqId: i})
	}
	s.ack(0, 2) // items of requests 1 and 2 acknowledged
	if n := s.Retained(); n != 2 {
		t.Fatalf("retained %d, want 2", n)
	}
	// 2 is retained, 3 and 4 still in flight, 77 unknown.
	s.Complete(2, 3, 4, 77)
	if n := s.Retained(); n != 1 {
		t.Fatalf("retained %d after completing request 2, want 1", n)
	}
	if b := s.Backlog(); b != 4 {
		t.Fatalf("backlog %d: completion must not drop unacknowledged items", b)
	}
	// A second item of request 3 sent after the completion (a resend
	// through another path) is retained: only the items marked are dropped.
	s.Send(&hamsv1.Item{ReqId: 3})
	s.ack(0, 7)
	if n := s.Retained(); n != 4 {
		t.Fatalf("retained %d, want 4 (requests 1, 5, 6 and the late item of 3)", n)
	}
	got := map[uint64]int{}
	s.mu.Lock()
	for _, r := range s.ret {
		if !s.retDead[r.it.GetReqId()] {
			got[r.it.GetReqId()]++
		}
	}
	s.mu.Unlock()
	if len(got) != 4 || got[1] != 1 || got[5] != 1 || got[6] != 1 || got[3] != 1 || got[4] != 0 {
		t.Fatalf("retained requests %v", got)
	}
}

// The mark survives a Resend (the unacknowledged items move into the new
// incarnation): completed items are resent, then dropped on their ack.
func TestCompleteBeforeAckAcrossResend(t *testing.T) {
	s, err := NewSender(SenderConfig{From: "a", To: "b", Resolver: NewStaticResolver(nil)})
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&hamsv1.Item{ReqId: 1}, &hamsv1.Item{ReqId: 2}, &hamsv1.Item{ReqId: 3})
	s.ack(0, 1)
	s.Complete(2)
	if n := s.Resend(ResendSpec{After: 0}); n != 1 {
		t.Fatalf("resent %d retained items, want 1", n)
	}
	if b := s.Backlog(); b != 3 {
		t.Fatalf("backlog %d after resend, want 3 (1 resent, 2 and 3 unacked)", b)
	}
	s.mu.Lock()
	gen := s.gen
	s.mu.Unlock()
	s.ack(gen, 3)
	// Request 1's copy is a resend (not retained twice), request 2 was
	// completed: only request 1 (original) and 3 remain.
	if n := s.Retained(); n != 2 {
		t.Fatalf("retained %d, want 2", n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.ret {
		if r.it.GetReqId() == 2 {
			t.Fatal("completed request 2 retained after its ack")
		}
	}
}
