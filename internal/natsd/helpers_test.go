package natsd

import (
	"io"
	"log/slog"
	"os"
	"testing"
	"time"
)

// testLogger logs to stderr with -v and HAMS_TEST_LOG set, else nowhere.
func testLogger(t *testing.T) *slog.Logger {
	t.Helper()
	if os.Getenv("HAMS_TEST_LOG") == "" {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test", t.Name())
}

// waitReady waits for s to accept connections.
func waitReady(t *testing.T, s *Server) {
	t.Helper()
	select {
	case <-s.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("server not ready after 30s")
	}
}
