package manager

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when goroutines outlive them: every
// loop a Manager starts (membership, recovery, the KV watch, the lease,
// the embedded NATS) must end when Run returns, every manager client's
// when its Run returns, and every test must stop what it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
