package fuzz

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeGo answers run.sh's go test call by MODE, counting its calls in
// the file COUNT: pass; flake (the fuzztime deadline once, then a pass);
// flake2 (the deadline every time); real (a finding with its input);
// real-deadline (a finding whose message names a deadline, input written).
const fakeGo = `#!/usr/bin/env bash
n=$(cat "$COUNT" 2>/dev/null || echo 0); echo $((n+1)) >"$COUNT"
deadline() { printf -- '--- FAIL: FuzzA (5.4s)\n    context deadline exceeded\nFAIL\n'; exit 1; }
case $MODE in
pass) echo PASS ;;
flake) [ "$n" = 0 ] && deadline; echo PASS ;;
flake2) deadline ;;
real) printf -- '--- FAIL: FuzzA (0.1s)\n    a_test.go:9: boom\n    Failing input written to testdata/fuzz/FuzzA/0123\nFAIL\n'; exit 1 ;;
real-deadline) printf -- '--- FAIL: FuzzA (5.0s)\n    a_test.go:9: context deadline exceeded\n    Failing input written to testdata/fuzz/FuzzA/0123\nFAIL\n'; exit 1 ;;
esac
`

// run.sh runs a target once more only when its failure is go1.26's
// fuzztime-deadline race (no input written), and fails on a real finding
// or a second failure.
func TestRunRetriesOnlyTheDeadlineRace(t *testing.T) {
	script, err := os.ReadFile("run.sh")
	require.NoError(t, err)
	for _, tc := range []struct {
		mode  string
		ok    bool
		calls string
	}{
		{"pass", true, "1"},
		{"flake", true, "2"},
		{"flake2", false, "2"},
		{"real", false, "1"},
		{"real-deadline", false, "1"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			repo := t.TempDir()
			require.NoError(t, os.MkdirAll(filepath.Join(repo, "test/fuzz"), 0o755))
			require.NoError(t, os.MkdirAll(filepath.Join(repo, "p"), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(repo, "test/fuzz/run.sh"), script, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(repo, "p/a_test.go"), []byte("package p\n\nfunc FuzzA(f *testing.F) {}\n"), 0o644))
			goBin := filepath.Join(t.TempDir(), "go")
			require.NoError(t, os.WriteFile(goBin, []byte(fakeGo), 0o755))
			count := filepath.Join(t.TempDir(), "count")
			cmd := exec.Command(filepath.Join(repo, "test/fuzz/run.sh"))
			cmd.Env = append(os.Environ(), "GO="+goBin, "MODE="+tc.mode, "COUNT="+count)
			out, err := cmd.CombinedOutput()
			if tc.ok {
				require.NoError(t, err, "%s", out)
			} else {
				require.Error(t, err, "%s", out)
			}
			calls, err := os.ReadFile(count)
			require.NoError(t, err)
			require.Equal(t, tc.calls, strings.TrimSpace(string(calls)), "go test calls; output:\n%s", out)
		})
	}
}
