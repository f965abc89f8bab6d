package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// newFlagSet is a subcommand's flags: its errors and -h go to stderr,
// where -h prints usage and then the flags with their defaults.
func newFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	return fs
}

// errStrayArgument is parseFlags' error for an argument that is no flag:
// the subcommands take none.
var errStrayArgument = errors.New("unexpected argument")

// parseFlags parses args into fs. help: -h printed the usage and there is
// nothing more to do. A flag the flag package refused is its error (it
// printed why, and the usage, to stderr); an argument left over is
// errStrayArgument, naming it.
func parseFlags(fs *flag.FlagSet, args []string) (help bool, err error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return true, nil
		}
		return false, err
	}
	if fs.NArg() > 0 {
		return false, fmt.Errorf("%w %q", errStrayArgument, fs.Arg(0))
	}
	return false, nil
}
