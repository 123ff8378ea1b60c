package shm

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

func testKey(t *testing.T) string {
	t.Helper()
	k := fmt.Sprintf("/hams_shm_test_%d_%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_"))
	t.Cleanup(func() { _ = Unlink(k) })
	return k
}

func TestCreateOpenShare(t *testing.T) {
	k := testKey(t)
	a, err := Create(k, 4096+7)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.Size() != 4103 || len(a.Bytes()) != 4103 || a.Key() != k {
		t.Fatalf("size %d len %d key %q", a.Size(), len(a.Bytes()), a.Key())
	}
	for _, c := range a.Bytes() {
		if c != 0 {
			t.Fatal("new region not zeroed")
		}
	}
	copy(a.Bytes()[4000:], "hello")
	b, err := Open(strings.TrimPrefix(k, "/")) // the leading slash is optional
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Size() != 4103 || string(b.Bytes()[4000:4005]) != "hello" {
		t.Fatalf("second mapping sees %q (size %d)", b.Bytes()[4000:4005], b.Size())
	}
	b.Bytes()[0] = 42
	if a.Bytes()[0] != 42 {
		t.Fatal("write through the second mapping not visible in the first")
	}
	if _, err := os.Stat(Dir + k); err != nil {
		t.Fatalf("object not under %s: %v", Dir, err)
	}
	if !Exists(k) {
		t.Fatal("Exists false for a live object")
	}
	// the name goes, the mappings stay
	if err := Unlink(k); err != nil {
		t.Fatal(err)
	}
	if Exists(k) {
		t.Fatal("Exists true after unlink")
	}
	a.Bytes()[1] = 7
	if b.Bytes()[1] != 7 {
		t.Fatal("mapping broken by unlink")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil || a.Bytes() != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := Unlink(k); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("unlink twice: %v", err)
	}
}

func TestCreateExistsAndMissing(t *testing.T) {
	k := testKey(t)
	r, err := Create(k, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := Create(k, 16); !errors.Is(err, os.ErrExist) || !strings.Contains(err.Error(), k) {
		t.Fatalf("duplicate create: %v", err)
	}
	if _, err := Open(k + "_missing"); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "_missing") {
		t.Fatalf("open missing: %v", err)
	}
}

func TestZeroSize(t *testing.T) {
	k := testKey(t)
	r, err := Create(k, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Size() != 0 || r.Bytes() != nil {
		t.Fatal("zero-size region has bytes")
	}
	o, err := Open(k)
	if err != nil || o.Size() != 0 {
		t.Fatalf("open zero-size: %v", err)
	}
	if err := errors.Join(r.Close(), o.Close()); err != nil {
		t.Fatal(err)
	}
}

func TestBadInputs(t *testing.T) {
	for _, k := range []string{"", "/", ".", "/..", "/a/b", "a\x00b", "/" + strings.Repeat("x", 256)} {
		if _, err := Create(k, 8); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("create %q: %v", k, err)
		}
		if _, err := Open(k); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("open %q: %v", k, err)
		}
		if err := Unlink(k); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("unlink %q: %v", k, err)
		}
	}
	k := testKey(t)
	for _, n := range []int{-1, MaxSize + 1} {
		if _, err := Create(k, n); !errors.Is(err, ErrInvalidSize) || !strings.Contains(err.Error(), fmt.Sprint(n)) {
			t.Errorf("size %d: %v", n, err)
		}
	}
	if Exists(k) {
		t.Fatal("failed create left an object behind")
	}
}

func TestKeyPart(t *testing.T) {
	if got := KeyPart("olv/learner.v2 x-_1"); got != "olv_learner_v2_x-_1" {
		t.Fatalf("KeyPart: %q", got)
	}
}
