package frontend

import (
	"container/list"
	"time"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// idemKey identifies a client request for idempotency: the client's
// request_id, scoped by service.
type idemKey struct {
	service   string
	requestID string
}

// replyCache remembers the answers to recently answered client requests
// (bounded LRU with a TTL), so a retry with the same request_id gets the
// same answer instead of a second execution. Pure: no goroutines, no locks,
// the caller passes now.
//
// Invariants: len(items) == order.Len() <= max; an element's expiry is its
// insertion time plus ttl; get never returns an expired answer.
type replyCache struct {
	max   int
	ttl   time.Duration
	order *list.List // front = most recently used; values are *cached
	items map[idemKey]*list.Element
}

// cached is one remembered answer: a reply or the error status.
type cached struct {
	key     idemKey
	resp    *hamsv1.PredictResponse
	err     error
	expires time.Time
}

func newReplyCache(max int, ttl time.Duration) *replyCache {
	return &replyCache{max: max, ttl: ttl, order: list.New(), items: map[idemKey]*list.Element{}}
}

// get returns the remembered answer for k, if any and not expired.
func (c *replyCache) get(k idemKey, now time.Time) (*cached, bool) {
	el, ok := c.items[k]
	if !ok {
		return nil, false
	}
	v := el.Value.(*cached)
	if !now.Before(v.expires) {
		c.order.Remove(el)
		delete(c.items, k)
		return nil, false
	}
	c.order.MoveToFront(el)
	return v, true
}

// put remembers an answer, evicting expired entries and then the least
// recently used ones beyond max.
func (c *replyCache) put(k idemKey, resp *hamsv1.PredictResponse, err error, now time.Time) {
	if c.max <= 0 || c.ttl <= 0 {
		return
	}
	v := &cached{key: k, resp: resp, err: err, expires: now.Add(c.ttl)}
	if el, ok := c.items[k]; ok {
		el.Value = v
		c.order.MoveToFront(el)
	} else {
		c.items[k] = c.order.PushFront(v)
	}
	c.evict(now)
}

// evict drops least recently used entries while there are more than max
// or while the least recently used one has expired. An expired entry deeper
// in the list stays until get or a later evict reaches it; get never
// returns it.
func (c *replyCache) evict(now time.Time) {
	for el := c.order.Back(); el != nil; el = c.order.Back() {
		v := el.Value.(*cached)
		if c.order.Len() <= c.max && now.Before(v.expires) {
			return
		}
		c.order.Remove(el)
		delete(c.items, v.key)
	}
}

// len is the number of remembered answers (expired ones included until the
// next put or get evicts them).
func (c *replyCache) len() int { return c.order.Len() }
