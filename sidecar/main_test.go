package sidecar

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when goroutines outlive them: every
// goroutine a Sidecar starts (stages, executors, the shipper, watches)
// must end when Run returns, and every test must stop what it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
