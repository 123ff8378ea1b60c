package harness

import (
	"errors"
	"fmt"
)

// ExitError carries a process exit code through the command functions.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }

func (e *ExitError) Unwrap() error { return e.Err }

// ErrUsage marks a command-line mistake (exit code 2).
var ErrUsage = errors.New("usage")

// Usagef is a command-line mistake (exit code 2) with the message format
// makes of a.
func Usagef(format string, a ...any) error {
	return &ExitError{Code: 2, Err: fmt.Errorf(format, a...)}
}
