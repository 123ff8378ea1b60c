package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"
)

const helperEnv = "HAMS_LAUNCH_TEST_HELPER"

// TestMain turns the test binary into the helper child when helperEnv is
// set: args[1] picks its behaviour.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helper(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func helper(args []string) int {
	mode, tag := "serve", ""
	if len(args) > 0 {
		mode = args[0]
	}
	if len(args) > 1 {
		tag = args[1]
	}
	sigs := make(chan os.Signal, 1)
	switch mode {
	case "exit-early":
		fmt.Fprintln(os.Stderr, "helper: cannot start: bad flag")
		return 3
	case "no-ready":
		// Not select{}: without other goroutines the runtime would
		// report a deadlock and exit.
		time.Sleep(time.Hour)
		return 0
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
	default:
		signal.Notify(sigs, syscall.SIGTERM)
	}
	fmt.Println("some noise before the ready line")
	b, _ := json.Marshal(map[string]any{"role": "helper", "tag": tag, "pid": os.Getpid()})
	fmt.Println(string(b))
	select {
	case <-sigs:
	case <-time.After(time.Hour): // keeps the runtime from reporting a deadlock
	}
	return 0
}

func newSup(t *testing.T, mod func(*Config)) *Supervisor {
	t.Helper()
	cfg := Config{RunDir: t.TempDir(), Env: []string{helperEnv + "=1"}, Grace: 2 * time.Second, ReadyTimeout: 10 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func TestStartReadsReadyLineAndCloseStops(t *testing.T) {
	s := newSup(t, nil)
	r, err := s.Start(context.Background(), Spec{Name: "a/b", Args: []string{"serve", "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.String("role") != "helper" || r.String("tag") != "x" || r.Generation != 1 {
		t.Fatalf("ready = %+v", r)
	}
	if int(r.Fields["pid"].(float64)) != r.PID || !alive(r.PID) {
		t.Fatalf("pid %d not the child's or not alive", r.PID)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if alive(r.PID) {
		t.Fatalf("child %d still alive after Close", r.PID)
	}
	log, err := os.ReadFile(s.LogPath("a/b"))
	if err != nil || !strings.Contains(string(log), "some noise") {
		t.Fatalf("log %q (%v) lacks the non-ready stdout", log, err)
	}
	if _, err := s.Start(context.Background(), Spec{Name: "c", Args: []string{"serve"}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close: %v", err)
	}
}

func TestRestartAfterKillUsesRestartArgs(t *testing.T) {
	s := newSup(t, nil)
	events := s.Subscribe()
	var lastSeen Ready
	spec := Spec{Name: "m", Args: []string{"serve", "first"}, Restart: func(last Ready) []string {
		lastSeen = last
		return []string{"serve", "again"}
	}}
	r1, err := s.Start(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Kill("m", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r2, err := s.WaitReady(ctx, "m", r1.Generation)
	if err != nil {
		t.Fatal(err)
	}
	if r2.PID == r1.PID || r2.Generation != 2 || r2.String("tag") != "again" {
		t.Fatalf("restart ready = %+v after %+v", r2, r1)
	}
	if lastSeen.PID != r1.PID {
		t.Fatalf("Restart hook saw %+v, want the first ready line", lastSeen)
	}
	if cur, ok := s.Ready("m"); !ok || cur.PID != r2.PID {
		t.Fatalf("Ready = %+v", cur)
	}
	var kinds []string
	for len(kinds) < 3 {
		select {
		case ev := <-events:
			kinds = append(kinds, ev.Kind)
		case <-ctx.Done():
			t.Fatalf("events so far %v", kinds)
		}
	}
	if strings.Join(kinds, ",") != "ready,exit,ready" {
		t.Fatalf("events %v", kinds)
	}
	if alive(r1.PID) {
		t.Fatal("killed child still alive")
	}
}

func TestCloseKillsChildIgnoringSIGTERM(t *testing.T) {
	s := newSup(t, func(c *Config) { c.Grace = 200 * time.Millisecond })
	r, err := s.Start(context.Background(), Spec{Name: "stubborn", Args: []string{"ignore-term"}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.Close()
	if alive(r.PID) {
		t.Fatal("child survived Close")
	}
	if time.Since(start) < 200*time.Millisecond {
		t.Fatal("Close did not wait for the grace period before SIGKILL")
	}
}

func TestStartFailures(t *testing.T) {
	s := newSup(t, func(c *Config) { c.ReadyTimeout = 300 * time.Millisecond })
	_, err := s.Start(context.Background(), Spec{Name: "early", Args: []string{"exit-early"}})
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "bad flag") {
		t.Fatalf("exit before ready: %v", err)
	}
	_, err = s.Start(context.Background(), Spec{Name: "slow", Args: []string{"no-ready"}})
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "no ready line") {
		t.Fatalf("ready timeout: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Start(ctx, Spec{Name: "cancelled", Args: []string{"no-ready"}}); !errors.Is(err, ErrNotReady) {
		t.Fatalf("cancelled start: %v", err)
	}
	if len(s.Names()) != 0 {
		t.Fatalf("failed starts are supervised: %v", s.Names())
	}
	if _, err := s.Start(context.Background(), Spec{Args: []string{"serve"}}); err == nil {
		t.Fatal("nameless child accepted")
	}
	if _, err := s.Kill("nobody", syscall.SIGKILL); !errors.Is(err, ErrUnknown) {
		t.Fatalf("Kill unknown: %v", err)
	}
	if _, err := s.WaitReady(context.Background(), "nobody", 0); !errors.Is(err, ErrUnknown) {
		t.Fatalf("WaitReady unknown: %v", err)
	}
}

func TestDuplicateNameAndConfig(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("New without RunDir accepted")
	}
	s := newSup(t, nil)
	if _, err := s.Start(context.Background(), Spec{Name: "d", Args: []string{"serve"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(context.Background(), Spec{Name: "d", Args: []string{"serve"}}); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate: %v", err)
	}
}

func TestNoRestartChildStaysDown(t *testing.T) {
	s := newSup(t, nil)
	r1, err := s.Start(context.Background(), Spec{Name: "once", Args: []string{"serve"}, NoRestart: true})
	if err != nil {
		t.Fatal(err)
	}
	if s.Exited("once") || s.Exited("nope") {
		t.Fatal("Exited before the exit")
	}
	if _, err := s.Kill("once", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done("once"):
	case <-time.After(10 * time.Second):
		t.Fatal("supervision did not end")
	}
	if !s.Exited("once") {
		t.Fatal("Exited = false after the exit")
	}
	if r, ok := s.Ready("once"); !ok || r.PID != r1.PID || r.Generation != 1 {
		t.Fatalf("Ready after exit = %+v, %v", r, ok)
	}
	if _, err := s.Kill("once", syscall.SIGKILL); !errors.Is(err, ErrUnknown) {
		t.Fatalf("Kill of an exited child: %v", err)
	}
	if s.Done("nope") != nil {
		t.Fatal("Done of an unknown child")
	}
	if _, err := s.Start(context.Background(), Spec{Name: "once", Args: []string{"serve"}}); !errors.Is(err, ErrExists) {
		t.Fatalf("name reuse: %v", err)
	}
}
