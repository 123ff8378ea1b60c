package datapath

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when goroutines outlive them. The
// Joiner and the Batcher are pure (no goroutines, time passed in): any
// goroutine left is a change that broke that.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
