#!/usr/bin/env bash
# make bench-cni-kernel: builds of the sriov CNI side by side in make
# e2e-kernel's guest (a real 6.12 kernel under TCG, igb/igbvf). Each round
# execs every build for VERSION, then ADD and DEL of the same igbvf VF in a
# fresh pod netns, with mac, vlan, spoofchk, trust and static IPAM; the
# order alternates from round to round. The guest prints a table of p50 /
# p90 in milliseconds, which this script repeats.
#
# Builds (each as the image builds it: CGO_ENABLED=0, -trimpath,
# -tags grpcnotrace, -ldflags '-s -w'):
#   fastpath   this checkout
#   BASE=REV   also the CNI of git revision REV, as "base"
#   UPSTREAM=FILE  also another CNI binary, as "upstream" (e.g. upstream
#              sriov-cni, built from its own repository)
#   E2E_KERNEL_BENCH_ROUNDS=N  rounds (25)
#
# Usage: test/e2e-kernel/bench-cni.sh   (as root, like make e2e-kernel)
set -euo pipefail

DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$DIR/../.." && pwd)
WORK=${WORK:-$REPO/.e2e-work}
OUT=$WORK/kernel/bench-bin
export PATH=/usr/local/go/bin:$PATH
rm -rf "$OUT" && mkdir -p "$OUT"

build() { # build NAME SRC
	(cd "$2" && CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -ldflags '-s -w' -o "$OUT/$1" ./cmd/sriov-cni)
}

build fastpath "$REPO"
bins="fastpath=$OUT/fastpath"
if [[ -n ${BASE:-} ]]; then
	wt=$(mktemp -d)
	trap 'git -C "$REPO" worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"' EXIT
	git -C "$REPO" worktree add --detach "$wt" "$BASE" >/dev/null
	build base "$wt"
	bins="base=$OUT/base $bins"
fi
if [[ -n ${UPSTREAM:-} ]]; then
	[[ -f $UPSTREAM ]] || { echo "UPSTREAM=$UPSTREAM: no such file" >&2; exit 2; }
	bins="$bins upstream=$UPSTREAM"
fi

log=$(mktemp)
E2E_KERNEL_CHECKS='^bench/' E2E_KERNEL_BENCH_BINS="$bins" "$DIR/run.sh" | tee "$log"
echo
grep -E '^ +(CNI builds|\|)' "$log" | sed 's/^ *//'
