// Package run holds the small concurrency helpers every component shares:
// a context-aware sleep and a goroutine group whose owner waits for every
// goroutine it started.
package run

import (
	"context"
	"sync"
	"time"
)

// Sleep waits d or until ctx ends; it reports whether the full d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Group owns goroutines: Wait returns once every goroutine started with Go
// has returned. The zero Group is ready to use. Unlike errgroup it does not
// cancel on error: components whose goroutines run until their context
// ends use it so that Run returns only after all of them did.
type Group struct {
	wg sync.WaitGroup
}

// Go starts f in a goroutine owned by g.
func (g *Group) Go(f func()) { g.wg.Go(f) }

// Wait blocks until every goroutine started with Go has returned.
func (g *Group) Wait() { g.wg.Wait() }
