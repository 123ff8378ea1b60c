package edge

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts has an owner that waits for it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
