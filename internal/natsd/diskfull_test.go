package natsd

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// mountTmpfs mounts a tmpfs of size on a fresh directory, or skips the
// test when mounting is not permitted (not root, no CAP_SYS_ADMIN).
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("a full disk needs a small file system: mount tmpfs: %v: %s (run as root)", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a file in dir until leave bytes are free.
func fill(t *testing.T, dir string, leave int64) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		free, err := FreeSpace(dir)
		if err != nil {
			t.Fatal(err)
		}
		if free <= leave {
			return path
		}
		n := min(int64(len(buf)), free-leave)
		if _, err := f.Write(buf[:n]); err != nil {
			return path
		}
	}
}

// TestDiskFullRecovers fills the store's file system (a real one: a
// tmpfs) under a publishing client until JetStream fails, frees the space
// and checks that Run restarts the server in place without anyone's help:
// publishes succeed again, on the same URL, and every acknowledged
// message is still there.
func TestDiskFullRecovers(t *testing.T) {
	dir := mountTmpfs(t, "16m")
	s, err := New(Config{Listen: "127.0.0.1:-1", StoreDir: filepath.Join(dir, "js"), MinFree: 1 << 20, HealthInterval: 50 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	waitReady(t, s)
	nc, err := nats.Connect(s.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
	defer ocancel()
	st, err := js.CreateStream(octx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(d time.Duration) (uint64, error) {
		c, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		ack, err := js.Publish(c, "s", make([]byte, 8<<10))
		if err != nil {
			return 0, err
		}
		return ack.Sequence, nil
	}
	var acked []uint64
	for range 10 {
		seq, err := publish(2 * time.Second)
		if err != nil {
			t.Fatalf("publish before the disk is full: %v", err)
		}
		acked = append(acked, seq)
	}
	filler := fill(t, dir, 128<<10)
	var failed bool
	for range 100 {
		seq, err := publish(500 * time.Millisecond)
		if err != nil {
			t.Logf("disk full: publish fails: %v", err)
			failed = true
			break
		}
		acked = append(acked, seq)
	}
	if !failed {
		t.Fatal("publishes kept succeeding on a full disk")
	}
	// Still failing while the disk is full: Run waits for space.
	if _, err := publish(300 * time.Millisecond); err == nil {
		t.Fatal("a publish succeeded on a full disk")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := publish(500 * time.Millisecond); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("publishes still fail %v after the space was freed: %v", time.Since(freed), err)
		}
	}
	t.Logf("space freed: publishes succeed again after %v (%d restart)", time.Since(freed).Round(time.Millisecond), s.Restarts())
	if s.Restarts() < 1 {
		t.Errorf("Restarts = %d, want the server restarted in place", s.Restarts())
	}
	for _, seq := range acked {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := st.GetMsg(c, seq)
		cancel()
		if err != nil {
			t.Errorf("acknowledged message %d lost: %v", seq, err)
		}
	}
}

// TestStoreTooSmall: a store whose file system has less than MinFree
// fails at once, naming both sizes.
func TestStoreTooSmall(t *testing.T) {
	_, _, err := Start(Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir(), MinFree: 1 << 60})
	if !errors.Is(err, ErrStoreTooSmall) {
		t.Fatalf("Start = %v, want ErrStoreTooSmall", err)
	}
	if !strings.Contains(err.Error(), "1024.0PiB required") || !strings.Contains(err.Error(), "free") {
		t.Errorf("error %q does not name the sizes", err)
	}
	_, _, err = Start(Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir(), MinFree: 64 << 20, MaxStore: 1 << 20})
	if !errors.Is(err, ErrStoreTooSmall) || !strings.Contains(err.Error(), "1.0MiB") || !strings.Contains(err.Error(), "64.0MiB") {
		t.Fatalf("Start with MaxStore below MinFree = %v, want ErrStoreTooSmall naming 1.0MiB and 64.0MiB", err)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"64MiB": 64 << 20, "4096": 4096, "1.5GiB": 3 << 29, "10MB": 10e6, "2k": 2048, "0": 0} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "12XB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
}
