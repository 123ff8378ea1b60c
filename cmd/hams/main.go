package main

import (
	"errors"
	"fmt"
	"os"
)

// exitError carries a process exit code through the command functions.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// errUsage marks a command-line mistake (exit code 2).
var errUsage = errors.New("usage")

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
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(stderr, "hams: %v\n", ee.err)
		}
		return ee.code
	}
	if errors.Is(err, errUsage) {
		fmt.Fprintf(stderr, "hams: %v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "hams: %v\n", err)
	return 1
}
