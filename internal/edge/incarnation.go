package edge

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
)

// Sender incarnations without clocks.
//
// An incarnation names one edge_seq numbering space of a sender. It used to
// be the sender's creation time, and receivers refused a lower one, so a
// replacement on a host whose clock was behind was fenced out for good.
// Now it is <nonce, counter> packed in a uint64: the nonce (the high
// NonceBits bits, never 0) is random per IncarnationSource (one per
// process), the counter (the low bits) counts the incarnations the source
// handed out, from 1. Nothing in it is a time, and receivers never order
// two processes by it:
//   - one sender process: a larger counter is a newer incarnation (a
//     Resend, new senders at a promotion); a smaller one is stale (the
//     tail of an old stream still in flight) and refused;
//   - another process at a lower epoch: refused by epoch before the
//     incarnation is looked at (the manager bumps a model's epoch on
//     every failover, and the frontend's entry edges are taken back by
//     the leader: OnStaleIncarnation);
//   - another process at the same or a newer epoch: a new stream that
//     replaces the current one (a restarted sender takes over whatever
//     its clock says); the replaced incarnation's nonce is remembered,
//     up to its counter, and refused from then on, so the stale sender
//     cannot take the edge back, and a retired nonce's later
//     incarnations (a leading frontend taking its entry edge back) are
//     new streams again.
//
// A receiver keeps at most MaxRetiredNonces retired nonces per edge (the
// oldest forgotten first): the scheme is bounded, and a huge incarnation
// (2^64-1) fences nothing, since another nonce simply replaces it.

// NonceBits is the width of an incarnation's process nonce; the counter
// has the 64-NonceBits low bits.
const NonceBits = 40

const counterBits = 64 - NonceBits

// MaxRetiredNonces bounds the replaced sender nonces a Receiver remembers
// per edge.
const MaxRetiredNonces = 32

// IncarnationNonce and IncarnationCounter split an incarnation.
func IncarnationNonce(inc uint64) uint64   { return inc >> counterBits }
func IncarnationCounter(inc uint64) uint64 { return inc & (1<<counterBits - 1) }

// IncarnationSource hands out incarnations: distinct, and increasing
// within one nonce. A process shares one (the default); tests make several
// to stand for several processes.
type IncarnationSource struct {
	mu      sync.Mutex
	nonce   uint64
	counter uint64
	fixed   bool // nonce given by the caller: tests
}

// NewIncarnationSource returns a source with a random nonce.
func NewIncarnationSource() *IncarnationSource {
	return &IncarnationSource{nonce: randomNonce()}
}

// NewIncarnationSourceNonce returns a source with the given nonce (tests:
// a replacement whose nonce is below its predecessor's). nonce is reduced
// to NonceBits bits; 0 becomes 1.
func NewIncarnationSourceNonce(nonce uint64) *IncarnationSource {
	nonce &= 1<<NonceBits - 1
	return &IncarnationSource{nonce: max(nonce, 1), fixed: true}
}

// Next returns a new incarnation. When the counter would overflow, the
// source takes a new random nonce (a fixed one wraps to counter 1 of
// nonce+1): a new nonce is a new sender to receivers, which is what a
// new incarnation must be.
func (s *IncarnationSource) Next() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counter == 1<<counterBits-1 {
		if s.fixed {
			s.nonce = max((s.nonce+1)&(1<<NonceBits-1), 1)
		} else {
			s.nonce = randomNonce()
		}
		s.counter = 0
	}
	s.counter++
	return s.nonce<<counterBits | s.counter
}

func randomNonce() uint64 {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			panic("edge: crypto/rand: " + err.Error()) // never fails on supported platforms
		}
		if n := binary.LittleEndian.Uint64(b[:]) & (1<<NonceBits - 1); n != 0 {
			return n
		}
	}
}

// processIncarnations is the source of every Sender without one of its own.
var processIncarnations = NewIncarnationSource()

// incarnationState is a receiver edge's view of its senders' incarnations.
type incarnationState struct {
	cur uint64 // the incarnation whose numbering the edge's Reorder tracks (0: none yet)
	// retired maps a replaced sender nonce to the largest counter of it
	// seen; retiredOrder lists them oldest first (bounded).
	retired      map[uint64]uint64
	retiredOrder []uint64
}

// incarnationVerdict is what a batch's incarnation means for the edge.
type incarnationVerdict int

const (
	incSame  incarnationVerdict = iota // the current stream
	incNew                             // a new stream: reset the edge's numbering
	incStale                           // an older incarnation: refuse
)

// judge classifies inc against the edge and, for incNew, makes it the
// current incarnation (retiring the replaced one's nonce when it is
// another's).
func (st *incarnationState) judge(inc uint64) incarnationVerdict {
	if inc == st.cur {
		return incSame
	}
	n, c := IncarnationNonce(inc), IncarnationCounter(inc)
	if st.cur != 0 && n == IncarnationNonce(st.cur) {
		if c < IncarnationCounter(st.cur) {
			return incStale
		}
		st.cur = inc
		return incNew
	}
	if last, ok := st.retired[n]; ok {
		if c <= last {
			return incStale
		}
		st.forget(n)
	}
	if st.cur != 0 {
		st.retire(IncarnationNonce(st.cur), IncarnationCounter(st.cur))
	}
	st.cur = inc
	return incNew
}

func (st *incarnationState) retire(n, c uint64) {
	if st.retired == nil {
		st.retired = map[uint64]uint64{}
	}
	if last, ok := st.retired[n]; ok {
		st.retired[n] = max(last, c)
		return
	}
	if len(st.retiredOrder) >= MaxRetiredNonces {
		delete(st.retired, st.retiredOrder[0])
		st.retiredOrder = append(st.retiredOrder[:0], st.retiredOrder[1:]...)
	}
	st.retired[n] = c
	st.retiredOrder = append(st.retiredOrder, n)
}

func (st *incarnationState) forget(n uint64) {
	delete(st.retired, n)
	for i, x := range st.retiredOrder {
		if x == n {
			st.retiredOrder = append(st.retiredOrder[:i], st.retiredOrder[i+1:]...)
			return
		}
	}
}
