package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/hams-go/hams/internal/harness"
)

func main() {
	os.Exit(dispatch(os.Args[1:]))
}

// dispatch runs the command line args (without the program name) through
// the command tree (commands.go) and returns the exit status.
func dispatch(args []string) int {
	defer stopTracing() // flush the spans of a role (tracing.go)
	return execute(args)
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *harness.ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			fmt.Fprintf(stderr, "hams: %v\n", ee.Err)
		}
		return ee.Code
	}
	if errors.Is(err, harness.ErrUsage) {
		fmt.Fprintf(stderr, "hams: %v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "hams: %v\n", err)
	return 1
}
