package natsd

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrStoreTooSmall is returned by Start when the JetStream store's file
// system has less free space than Config.MinFree.
var ErrStoreTooSmall = errors.New("natsd: JetStream store too small")

// DefaultMinFree is Config.MinFree when 0: room for the coordination
// streams of a deployment under load for a while (the request and reply
// logs are capped at 1 GiB each, but hold minutes of traffic, far less).
const DefaultMinFree = 64 << 20

// DefaultHealthInterval is Config.HealthInterval when 0.
const DefaultHealthInterval = 250 * time.Millisecond

// restartFreeFloor is the least free space Run waits for before it
// restarts a JetStream that disabled itself, whatever MinFree says: a
// server restarted into a disk with a few KiB free would fill it again
// with its first writes.
const restartFreeFloor = 1 << 20

func minFree(v int64) int64 {
	if v == 0 {
		return DefaultMinFree
	}
	return v
}

func restartFree(v int64) int64 { return max(minFree(v), restartFreeFloor) }

// FreeSpace is the space available to an unprivileged writer on the file
// system holding dir.
func FreeSpace(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("natsd: free space of %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// checkStore creates the store directory and checks that its file system
// has MinFree available, and that MaxStore (when set) is no smaller than
// MinFree.
func checkStore(dir string, minFreeCfg, maxStore int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("natsd: create JetStream store %s: %w", dir, err)
	}
	need := minFree(minFreeCfg)
	if need < 0 {
		return nil
	}
	if maxStore > 0 && maxStore < need {
		return fmt.Errorf("%w: MaxStore %s is below the minimum of %s (MinFree)", ErrStoreTooSmall, FormatSize(maxStore), FormatSize(need))
	}
	free, err := FreeSpace(dir)
	if err != nil {
		return err
	}
	if free < need {
		return fmt.Errorf("%w: %s has %s free, at least %s required (MinFree, --store-min-free)", ErrStoreTooSmall, dir, FormatSize(free), FormatSize(need))
	}
	return nil
}

// FormatSize writes n bytes in the largest binary unit that keeps one
// decimal ("64.0MiB", "512B").
func FormatSize(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return strconv.FormatInt(n, 10) + "B"
	}
	f, u := float64(n), 0
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	for f /= unit; (f >= unit || f <= -unit) && u < len(units)-1; u++ {
		f /= unit
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + units[u]
}

// ParseSize reads a size: a number of bytes with an optional unit, B,
// KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000),
// case-insensitive ("64MiB", "1.5GiB", "4096").
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, suffix := strings.TrimSpace(t[:i]), strings.ToLower(strings.TrimSpace(t[i:]))
	mult := map[string]float64{"": 1, "b": 1,
		"k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
		"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}[suffix]
	f, err := strconv.ParseFloat(num, 64)
	if mult == 0 || err != nil || f < 0 {
		return 0, fmt.Errorf("natsd: size %q: want a number of bytes with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s)
	}
	return int64(f * mult), nil
}

// isStoreFault reports whether a nats-server error message is a failed
// store write. The file store keeps a failed write's error and returns it
// for every later write ("Critical write error"), so a JetStream that ran
// out of space keeps failing after the space is back, with JetStream
// still enabled; only a restart clears it. nats-server itself matches
// "no space left" (isOutOfSpaceErr) where it disables JetStream instead.
func isStoreFault(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "no space left") || strings.Contains(m, "critical write error")
}
