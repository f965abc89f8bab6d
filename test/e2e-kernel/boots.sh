#!/usr/bin/env bash
# make e2e-kernel-boots: boots the e2e-kernel guest BOOTS times in a row
# (default 5) with LOAD busy loops beside it (default 4: a load average
# of 4 or more on top of whatever else runs), running only the setup and
# the capture (E2E_KERNEL_CHECKS matches no other check), and counts the
# boots that reached their last check and the kernel panics. One early
# boot of 7.3 under load panicked ("timer doesn't work through
# Interrupt-remapped IO-APIC") before run.sh put no_timer_check on the
# kernel command line; this is how that is measured.
#
# Usage: test/e2e-kernel/boots.sh   (as root; KERNEL, BOOTS, LOAD, WORK)
set -uo pipefail

DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$DIR/../.." && pwd)
WORK=${WORK:-$REPO/.e2e-work}
# shellcheck source=test/e2e-kernel/kernel.sh
source "$DIR/kernel.sh"
KERNEL=${KERNEL:-$KERNEL_DEFAULT}
BOOTS=${BOOTS:-5}
LOAD=${LOAD:-4}

loops=()
stop_loops() {
	local p
	for p in "${loops[@]}"; do
		kill "$p" 2>/dev/null
	done
	wait "${loops[@]}" 2>/dev/null
	loops=()
}
trap stop_loops EXIT
for ((i = 0; i < LOAD; i++)); do
	sh -c 'while :; do :; done' &
	loops+=($!)
done

ok=0 panics=0 died=0
for ((b = 1; b <= BOOTS; b++)); do
	rm -f "$WORK/kernel/$KERNEL/result"
	t=$(date +%s)
	E2E_KERNEL_CHECKS='^boot-only$' KERNEL=$KERNEL "$DIR/run.sh" >"$WORK/kernel/boots-$KERNEL-$b.log" 2>&1
	rc=$?
	secs=$(($(date +%s) - t))
	load=$(cut -d' ' -f1 /proc/loadavg)
	cp "$WORK/kernel/$KERNEL/run/console.log" "$WORK/kernel/boots-$KERNEL-$b.console.log" 2>/dev/null
	read -r _ _ pass fail _ _ done_marker kpanic <"$WORK/kernel/$KERNEL/result" 2>/dev/null || {
		pass=0 fail=0 done_marker=0 kpanic=0
	}
	((kpanic > 0)) && panics=$((panics + 1))
	if ((rc == 0 && done_marker > 0 && kpanic == 0)); then
		ok=$((ok + 1))
	else
		died=$((died + 1))
	fi
	echo "boot $b/$BOOTS, kernel $KERNEL: run.sh exit $rc, $pass passed, $fail failed, reached the end: $done_marker, panics: $kpanic, ${secs}s, load average at its end $load"
done
stop_loops
echo "kernel $KERNEL: $ok of $BOOTS boots in a row ran to their end with $LOAD busy loops beside, $panics panicked, $died died"
((ok == BOOTS))
