package protocol_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them: the
// machines under protocol/ are pure and start none.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
