package dlocktest

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if any goroutine outlives the tests and examples:
// every Client they make must have stopped its goroutines by Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
