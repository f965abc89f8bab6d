#!/usr/bin/env bash
# make e2e-kernel-matrix: make e2e-kernel on every kernel kernel.sh knows
# (5.10, 6.1, 6.12, 7.3), one after the other, then one table: kernel,
# passed, failed, skipped, seconds. Exits 1 when any kernel had a failed
# check or a guest that died. MATRIX_KERNELS="6.12 7.3" runs a subset.
#
# Usage: test/e2e-kernel/matrix.sh   (as root; WORK and run.sh's variables)
set -uo pipefail

DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$DIR/../.." && pwd)
WORK=${WORK:-$REPO/.e2e-work}
# shellcheck source=test/e2e-kernel/kernel.sh
source "$DIR/kernel.sh"
KERNELS=${MATRIX_KERNELS:-$KERNELS}

rc=0
rows=()
for k in $KERNELS; do
	echo "=== make e2e-kernel KERNEL=$k"
	rm -f "$WORK/kernel/$k/result"
	t=$(date +%s)
	# each kernel's own pins (an outer KERNEL_ABI would name one kernel only)
	env -u KERNEL_ABI -u KERNEL_PKG_VERSION KERNEL="$k" "$DIR/run.sh"
	krc=$?
	secs=$(($(date +%s) - t))
	if [[ -f $WORK/kernel/$k/result ]]; then
		# kernel abi passed failed skipped seconds done panics
		read -r _ abi pass fail skipped _ done_marker _ <"$WORK/kernel/$k/result"
		note=
		((done_marker > 0)) || note="guest died before its last check"
		rows+=("$(printf '%-5s %-22s %6s %6s %7s %6s  %s' "$k" "$abi" "$pass" "$fail" "$skipped" "$secs" "$note")")
	else
		rows+=("$(printf '%-5s %-22s %6s %6s %7s %6s  %s' "$k" "-" "-" "-" "-" "$secs" "no result (run.sh exit $krc; a SKIP of the whole tier?)")")
	fi
	((krc == 0)) || rc=1
done
echo
printf '%-5s %-22s %6s %6s %7s %6s\n' kernel abi passed failed skipped time_s
printf '%s\n' "${rows[@]}"
exit $rc
