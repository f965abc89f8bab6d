package main

import (
	"context"
	"errors"
	"io"
)

// runServe is being built (issue 3).
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("serve: not implemented yet")
}
