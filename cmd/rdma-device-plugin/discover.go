package main

import (
	"context"
	"errors"
	"io"
)

func runDiscover(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("discover: not implemented yet")
}
