package frontend

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when goroutines outlive them: every
// loop a Frontend starts must end when Run returns, and every test must
// stop what it started (servers, clients, embedded NATS).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
