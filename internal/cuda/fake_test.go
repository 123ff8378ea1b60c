//go:build linux && !nocuda

package cuda_test

import (
	"testing"

	"github.com/hams-go/hams/internal/testing/cudatest"
)

// TestWithFakeDriver runs this package's GPU tests against the fakecuda
// test double (where there is no GPU and gcc exists).
func TestWithFakeDriver(t *testing.T) {
	cudatest.RunWithFakeDriver(t, "^(TestAllocCopyRoundTrip|TestIPCAcrossProcesses|TestIPCChild)$", "TestAllocCopyRoundTrip", "TestIPCAcrossProcesses")
}
