package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// parseFlags: -h prints the usage and then the flags and asks for
// nothing more; a flag the flag package refuses is its error, with the
// usage; an argument left over is errStrayArgument, naming it.
func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		help    bool
		err     string
		stray   bool
		printed string
		verbose bool
	}{
		{name: "flags", args: []string{"-v"}, verbose: true},
		{name: "help", args: []string{"-h"}, help: true, printed: "usage: x [-v]\n  -v\tsay more"},
		{name: "unknown flag", args: []string{"--nope"}, err: "flag provided but not defined: -nope", printed: "usage: x [-v]\n"},
		{name: "stray argument", args: []string{"-v", "now"}, err: `unexpected argument "now"`, stray: true, verbose: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			fs := newFlagSet("x", "usage: x [-v]\n", &stderr)
			verbose := fs.Bool("v", false, "say more")
			help, err := parseFlags(fs, tc.args)
			require.Equal(t, tc.help, help)
			if tc.err == "" {
				require.NoError(t, err)
			} else {
				require.EqualError(t, err, tc.err)
			}
			require.Equal(t, tc.stray, errors.Is(err, errStrayArgument))
			require.Contains(t, stderr.String(), tc.printed)
			require.Equal(t, tc.verbose, *verbose)
		})
	}
}

// The top-level --help lists every subcommand run dispatches to, and each
// has a --help of its own that names it.
func TestHelpListsEverySubcommand(t *testing.T) {
	var out, errs bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"--help"}, &out, &errs))
	require.Len(t, subcommands, 6) // serve, discover, doctor, provision, install-cni, uninstall: run's cases
	for _, c := range subcommands {
		require.Regexp(t, `(?m)^  `+c.name+`\s+\S`, errs.String(), "--help lists %s", c.name)
		var sub bytes.Buffer
		require.NoError(t, run(context.Background(), []string{c.name, "--help"}, io.Discard, &sub), c.name)
		want := "usage: rdma-device-plugin " + c.name
		if c.name == "serve" {
			want = "usage: rdma-device-plugin [SUBCOMMAND]"
		}
		require.Contains(t, sub.String(), want)
		require.Contains(t, sub.String(), "\n  -", "%s --help lists its flags", c.name)
	}
}
