package edge

import "sync"

// StaticResolver is a Resolver over a fixed table that can be changed by
// Set (tests, single-process wiring, static deployments).
type StaticResolver struct {
	mu      sync.Mutex
	addrs   map[string]string
	epochs  map[string]uint64
	changed chan struct{}
}

// NewStaticResolver creates a resolver from model -> address.
func NewStaticResolver(addrs map[string]string) *StaticResolver {
	r := &StaticResolver{addrs: map[string]string{}, epochs: map[string]uint64{}, changed: make(chan struct{})}
	for m, a := range addrs {
		r.addrs[m] = a
	}
	return r
}

// Resolve implements Resolver.
func (r *StaticResolver) Resolve(model string) (string, uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.addrs[model]
	return a, r.epochs[model], ok
}

// Changed implements Resolver.
func (r *StaticResolver) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// Set changes (addr != "") or removes (addr == "") a model's address and
// epoch, and signals Changed.
func (r *StaticResolver) Set(model, addr string, epoch uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if addr == "" {
		delete(r.addrs, model)
	} else {
		r.addrs[model] = addr
	}
	r.epochs[model] = epoch
	close(r.changed)
	r.changed = make(chan struct{})
}
