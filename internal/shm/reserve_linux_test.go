package shm

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// An object larger than the tmpfs that holds it fails at reserve with
// ENOSPC (without it, the first write past the limit is a SIGBUS).
func TestReserveFailsOnAFullTmpfs(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small tmpfs here (needs root): %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	f, err := os.Create(dir + "/obj")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(4 << 20); err != nil {
		t.Fatal(err)
	}
	if err := reserve(f, 4<<20); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("reserve of 4 MiB on a 1 MiB tmpfs: %v, want ENOSPC", err)
	}
	if err := reserve(f, 512<<10); err != nil {
		t.Fatalf("reserve of 512 KiB: %v", err)
	}
}
