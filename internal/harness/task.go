package harness

import (
	"fmt"
	"log/slog"
	"os"
)

// taskFlags are the options shared by the tasks up, demo, chaos and bench:
// where the run directory is, whether it is kept, and what the child
// processes log and trace.
type Task struct {
	RunDir   string
	Keep     bool
	LogLevel string
	Verbose  bool
	// TraceArgs are the tracing flags of every child (--otlp,
	// --trace-ratio; empty: tracing off).
	TraceArgs []string
}

// Prepare returns the run dir and a cleanup that removes it unless kept.
func (t *Task) Prepare(prefix string) (dir string, cleanup func(ok bool), err error) {
	if t.RunDir != "" {
		if err := os.MkdirAll(t.RunDir, 0o755); err != nil {
			return "", nil, fmt.Errorf("create run dir: %w", err)
		}
		return t.RunDir, func(bool) {}, nil
	}
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, fmt.Errorf("create run dir: %w", err)
	}
	return dir, func(ok bool) {
		if ok && !t.Keep {
			os.RemoveAll(dir)
		} else {
			fmt.Fprintf(os.Stderr, "hams: logs kept in %s\n", dir)
		}
	}, nil
}

// TaskLogger logs the supervisor's events on stderr when verbose.
func TaskLogger(verbose bool) *slog.Logger {
	if !verbose {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
