// Package run holds the small concurrency helpers every component shares:
// a context-aware sleep.
package run

import (
	"context"
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
