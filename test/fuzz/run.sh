#!/usr/bin/env bash
# Runs every Fuzz... target in the repo for FUZZTIME each (after its
# committed seed corpus in testdata/fuzz/ and its f.Add seeds, which plain
# go test runs too). A failure leaves the input in testdata/fuzz/ to commit
# with the fix.
#
# One failure is run again: go1.26's fuzz coordinator can report the
# -fuzztime deadline itself as a failure ("context deadline exceeded",
# golang/go#75804, fixed in go1.27) when a worker is still busy as the
# time runs out on a loaded machine. That failure writes no input. A run
# that fails that way, and only that way, is made once more; a second
# failure of any kind fails the target. A real finding always writes its
# input ("Failing input written to ..."), and fails at once.
#
# Usage: make fuzz   or   FUZZTIME=30s GO=go test/fuzz/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-5s}
BIN=${BIN:-bin}

out=$(mktemp)
trap 'rm -f "$out"' EXIT

# fuzz1 runs target $2 of package $1 once, its output (less the progress
# lines) to stdout and to $out.
fuzz1() {
	"$GO" test -run '^$' -fuzz "^$2\$" -fuzztime "$FUZZTIME" "$1" 2>&1 | grep -v '^fuzz: elapsed' | tee "$out"
}

for f in $(grep -rl --include='*_test.go' --exclude-dir=.e2e-work --exclude-dir="$BIN" '^func Fuzz' . | sort); do
	pkg=$(dirname "$f")
	for t in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$f"); do
		echo "fuzz $pkg $t ($FUZZTIME)"
		fuzz1 "$pkg" "$t" && continue
		if grep -q 'context deadline exceeded' "$out" && ! grep -q 'Failing input written' "$out"; then
			echo "fuzz $pkg $t: the fuzztime deadline reported as a failure, no input written (golang/go#75804); once more"
			fuzz1 "$pkg" "$t" && continue
		fi
		exit 1
	done
done
