// Package run holds the small concurrency helpers every component shares:
// a context-aware sleep and a group of goroutines with one owner.
package run

import (
	"context"
	"errors"
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

// Group is a set of goroutines that share one context and one owner: Go
// starts one, Stop cancels them all and waits for every one. An error a
// goroutine returns while the group's context is live goes to the
// group's onErr (the owner's fatal path) or, with none, is kept for Wait
// and cancels the others. The zero Group is not usable; NewGroup makes
// one. Cancel, Wait and Stop may be called any number of times, from any
// goroutine; Go after Stop starts nothing.
type Group struct {
	ctx    context.Context
	cancel context.CancelFunc
	onErr  func(error)
	wg     sync.WaitGroup

	mu      sync.Mutex
	stopped bool
	err     error
}

// NewGroup returns a group whose goroutines run under a child of ctx.
// onErr, when not nil, receives each error returned while the group's
// context is live (the group is not canceled for it: onErr decides).
func NewGroup(ctx context.Context, onErr func(error)) *Group {
	ctx, cancel := context.WithCancel(ctx)
	return &Group{ctx: ctx, cancel: cancel, onErr: onErr}
}

// Context is the group's context: canceled by Cancel or Stop, or when
// the parent ends.
func (g *Group) Context() context.Context { return g.ctx }

// Go runs f in a goroutine of the group (nothing once the group is
// stopped).
func (g *Group) Go(f func(ctx context.Context) error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := f(g.ctx); err != nil && g.ctx.Err() == nil {
			g.fail(err)
		}
	}()
}

func (g *Group) fail(err error) {
	if g.onErr != nil {
		g.onErr(err)
		return
	}
	g.mu.Lock()
	g.err = errors.Join(g.err, err)
	g.mu.Unlock()
	g.cancel()
}

// Cancel cancels the group's context; it does not wait.
func (g *Group) Cancel() { g.cancel() }

// Wait waits for every goroutine started and returns the errors kept
// (joined; always nil with an onErr).
func (g *Group) Wait() error {
	g.wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Stop cancels the group, waits for every goroutine, and returns what
// Wait does; no goroutine starts after it.
func (g *Group) Stop() error {
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
	g.cancel()
	return g.Wait()
}
