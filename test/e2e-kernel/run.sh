#!/usr/bin/env bash
# make e2e-kernel: fastpath inside a real Linux kernel with emulated SR-IOV
# NICs. QEMU (>= 8.0, TCG) boots one of Debian's own kernels (KERNEL=5.10,
# 6.1, 6.12 or 7.3; 6.12, bookworm-backports', when unset) with three
# Intel 82576 (igb) PFs behind PCIe root ports and an IOMMU;
# an initramfs holds busybox, iproute2, the product's static binaries, the
# CNI reference IPAM plugins, the guest check program (test/e2e-kernel/guest)
# and the kernel modules it needs. The guest prints one PASS or FAIL line
# per check, or "SKIP: <check>: <reason>" where the kernel lacks what a
# check needs; this script counts them. See test/e2e-kernel/README.md.
#
# Everything fetched or built is cached under $WORK/kernel (WORK defaults
# to .e2e-work, git-ignored): each kernel in linux-<abi>/, each kernel's
# initramfs and run in <KERNEL>/; only a run's own files are remade. When QEMU
# or the kernel cannot be had it prints "SKIP: <reason>" and exits 0.
#
# Usage: test/e2e-kernel/run.sh   (as root; WORK, KERNEL, KERNEL_ABI, KERNEL_PKG_VERSION,
#                                  QEMU_TIMEOUT, E2E_KERNEL_CHECKS override the defaults;
#                                  E2E_KERNEL_BENCH_BINS and _ROUNDS are bench-cni.sh's;
#                                  E2E_KERNEL_SRC builds the binaries from another checkout)
set -euo pipefail
# All of it in one group, which bash reads whole before running any of it:
# editing this file while a run boots its guest does not change that run.
{

DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$DIR/../.." && pwd)
WORK=${WORK:-$REPO/.e2e-work}
CACHE=$WORK/kernel

# The guest kernel, its suite, ABI and pinned package version, and how to
# fetch it: test/e2e-kernel/kernel.sh (other tiers that boot these kernels
# source it too).
# shellcheck source=test/e2e-kernel/kernel.sh
source "$DIR/kernel.sh"
KERNEL=${KERNEL:-$KERNEL_DEFAULT}
kernel_select "$KERNEL" || exit 2
KC=$CACHE/$KERNEL
RUN=$KC/run
# QEMU 8.0 is the first with -device igb (SR-IOV); bookworm-backports has
# 10.0.2 (the version this tier was measured on).
QEMU_PKG_VERSION=${QEMU_PKG_VERSION:-1:10.0.2+ds-2+deb13u1~bpo12+1}
QEMU_MIN_MAJOR=8
# The whole guest run, boot to poweroff; it takes 3-5 minutes on 2 cores,
# and 25 at a load average of 50 (7.3 with the RDMA bytes, measured).
QEMU_TIMEOUT=${QEMU_TIMEOUT:-1800}
# The modules the guest loads (their dependencies come from modules.dep):
# each must be in the kernel, as a file or built in.
# virtio_pci is built into 6.12 and a module on 5.10 (without it the
# capture disk has no /dev/vda).
MODULES="igb igbvf vfio-pci virtio_pci virtio_blk veth"
# Those a kernel may lack: its checks that need them SKIP, naming the
# module (/etc/e2e-modules-absent in the guest). 7.x has no crc32_generic
# (crc32 is library code there, built in).
MODULES_OPTIONAL="rdma_rxe ib_uverbs rdma_ucm crc32_generic"
# Debian's busybox-static, iproute2 and util-linux's setpriv are what the
# guest's userland is; rdma-core's ibv_rc_pingpong (ibverbs-utils), its rxe
# provider (ibverbs-providers) and perftest's ib_write_bw move the RDMA
# bytes between pods (guest/rdmabytes.go).
DEBS_NEEDED="busybox-static kmod xz-utils zstd cpio iproute2 util-linux ibverbs-utils ibverbs-providers perftest"

export PATH=/usr/local/go/bin:/usr/sbin:/sbin:$PATH

T0=$(date +%s)
log() { printf '%s e2e-kernel: %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
skip() { echo "SKIP: $*"; exit 0; }

[[ $(id -u) == 0 ]] || {
	echo "make e2e-kernel needs root: it installs QEMU and the guest's userland from Debian packages when they are missing (sudo make e2e-kernel)"
	exit 2
}

# backports_sources adds the suite bookworm-backports on the mirror the
# machine already uses, as a deb822 file, unless some source has it.
backports_sources() {
	if grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
		return 0
	fi
	local mirror
	mirror=$(awk '/^URIs:/ && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
	[[ -n $mirror ]] || mirror=$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
	[[ -n $mirror ]] || return 1
	log "adding bookworm-backports ($mirror) in /etc/apt/sources.list.d/backports.sources"
	printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
		"$mirror" >/etc/apt/sources.list.d/backports.sources
	APT_UPDATED=
}

APT_UPDATED=
apt_update() {
	[[ -n $APT_UPDATED ]] && return 0
	apt-get update -qq && APT_UPDATED=1
}

qemu_major() {
	qemu-system-x86_64 --version 2>/dev/null | awk 'NR == 1 { split($4, v, "."); print v[1] + 0 }'
}

# install_deps installs what is missing, idempotently: QEMU from
# bookworm-backports, the guest's userland from the machine's suite.
install_deps() {
	command -v apt-get >/dev/null || return 0
	local need=() p
	for p in $DEBS_NEEDED; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need+=("$p")
	done
	if ((${#need[@]})); then
		log "installing ${need[*]}"
		apt_update || log "apt-get update failed"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 || log "could not install ${need[*]}"
	fi
	if [[ $(qemu_major) -lt $QEMU_MIN_MAJOR ]]; then
		backports_sources || log "no Debian mirror found for bookworm-backports"
		apt_update || log "apt-get update failed"
		log "installing qemu-system-x86 $QEMU_PKG_VERSION from bookworm-backports"
		if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t bookworm-backports "qemu-system-x86=$QEMU_PKG_VERSION" >&2; then
			log "qemu-system-x86 $QEMU_PKG_VERSION is not on the mirror; installing what bookworm-backports has"
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 >&2 || true
		fi
	fi
}

# build_go builds the product's binaries, the CNI reference IPAM plugins
# (the versions go.mod pins) and the guest program, static.
build_go() {
	local bin=$CACHE/bin t
	mkdir -p "$bin"
	t=$(date +%s)
	(
		cd "${E2E_KERNEL_SRC:-$REPO}"
		export CGO_ENABLED=0
		go build -trimpath -tags grpcnotrace,nodra -o "$bin/" ./cmd/rdma-device-plugin ./cmd/sriov-cni ./test/e2e-kernel/guest
		go build -trimpath -o "$bin/" github.com/containernetworking/plugins/plugins/ipam/static github.com/containernetworking/plugins/plugins/ipam/host-local
	)
	log "go build: $(($(date +%s) - t))s"
}

# module_paths prints the modules' files and their dependencies, in
# modules.dep's relative form.
# A module built into the kernel has no file: it is left out, and named in
# the guest's /etc/e2e-modules-builtin (modprobe there has nothing to do).
module_paths() {
	local dep=$KERNEL_MODDIR/modules.dep m line
	for m in $MODULES $MODULES_OPTIONAL; do
		line=$(grep -E "/${m//[-_]/[-_]}\.ko(\.xz|\.zst|\.gz)?:" "$dep") || continue
		echo "$line" | tr -d ':' | tr ' ' '\n'
	done | sort -u
}

# module_lists writes the guest's /etc/e2e-modules-builtin and
# /etc/e2e-modules-absent, and fails on a required module the kernel lacks.
module_lists() {
	local m re
	: >"$ROOT/etc/e2e-modules-builtin"
	: >"$ROOT/etc/e2e-modules-absent"
	for m in $MODULES $MODULES_OPTIONAL; do
		re="/${m//[-_]/[-_]}\.ko(\.xz|\.zst|\.gz)?"
		if grep -qE "$re:" "$KERNEL_MODDIR/modules.dep"; then
			continue
		elif grep -qsE "$re\$" "$KERNEL_MODDIR/modules.builtin"; then
			echo "$m" >>"$ROOT/etc/e2e-modules-builtin"
		elif [[ " $MODULES_OPTIONAL " == *" $m "* ]]; then
			log "kernel $KERNEL has no module $m: the checks that need it skip"
			echo "$m" >>"$ROOT/etc/e2e-modules-absent"
		else
			die "kernel $KERNEL ($KERNEL_ABI) has no module $m (not in modules.dep nor modules.builtin)"
		fi
	done
}

# make_initramfs stages the guest's root and packs it (newc, uncompressed:
# TCG pays for every decompressed byte).
make_initramfs() {
	ROOT=$KC/root
	rm -rf "$ROOT" && mkdir -p "$ROOT"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,etc,opt/cni/bin,var/lib,mnt}
	local busybox
	busybox=$(command -v busybox) || die "no busybox (busybox-static)"
	ldd "$busybox" >/dev/null 2>&1 && die "$busybox is not static: install busybox-static"
	install -m 0755 "$busybox" "$ROOT/bin/busybox"
	local ip rdma
	ip=$(command -v ip) || die "no ip (iproute2)"
	rdma=$(command -v rdma) || die "no rdma (iproute2)"
	copy_with_libs "$(readlink -f "$ip")"
	copy_with_libs "$(readlink -f "$rdma")"
	# setpriv runs the plugin with the DaemonSet's capabilities (guest/daemonset.go)
	local setpriv script
	setpriv=$(command -v setpriv) || die "no setpriv (util-linux)"
	copy_with_libs "$(readlink -f "$setpriv")"
	# script runs the verbs tools on a pty: their output line by line
	script=$(command -v script) || die "no script (util-linux)"
	copy_with_libs "$(readlink -f "$script")"
	# the verbs tools, their libraries, and rdma-core's soft-RoCE
	# provider with its driver file (kernel.sh)
	copy_verbs_tools || die "the guest's verbs tools are missing (above)"
	[[ -e $ROOT/sbin/ip ]] || ln -s "$(readlink -f "$ip")" "$ROOT/sbin/ip"
	[[ -e $ROOT/usr/bin/rdma ]] || ln -s "$(readlink -f "$rdma")" "$ROOT/usr/bin/rdma"
	# the loader ldd names as a path (/lib64/ld-linux-x86-64.so.2) is a link on the host
	local bin=$CACHE/bin
	install -m 0755 "$bin/rdma-device-plugin" "$bin/guest" "$ROOT/usr/bin/"
	install -m 0755 "$bin/sriov-cni" "$ROOT/opt/cni/bin/sriov"
	install -m 0755 "$bin/static" "$bin/host-local" "$ROOT/opt/cni/bin/"
	install -m 0755 "$DIR/init" "$ROOT/init"
	# CNI builds for the guest's bench/ checks (bench-cni.sh): NAME=PATH ...
	local b
	for b in ${E2E_KERNEL_BENCH_BINS:-}; do
		[[ $b == *=* && -f ${b#*=} ]] || die "E2E_KERNEL_BENCH_BINS: $b is not NAME=FILE"
		install -D -m 0755 "${b#*=}" "$ROOT/opt/cni/bench/${b%%=*}"
	done
	local m mods=$ROOT/lib/modules/$KERNEL_ABI
	mkdir -p "$mods"
	for m in $(module_paths); do
		mkdir -p "$mods/$(dirname "$m")"
		case $m in
		*.xz) xz -dc "$KERNEL_MODDIR/$m" >"$mods/${m%.xz}" ;;
		*.zst) zstd -qdc "$KERNEL_MODDIR/$m" >"$mods/${m%.zst}" ;;
		*) cp "$KERNEL_MODDIR/$m" "$mods/$m" ;;
		esac
	done
	cp "$KERNEL_MODDIR"/modules.{builtin,builtin.modinfo,order} "$mods/" 2>/dev/null || true
	module_lists
	depmod -b "$ROOT" "$KERNEL_ABI"
	echo "root:x:0:0:root:/root:/bin/sh" >"$ROOT/etc/passwd"
	echo "$KERNEL_ABI" >"$ROOT/etc/kernel-abi"
	(cd "$ROOT" && find . -print0 | cpio --null -o -H newc --quiet) >"$KC/initramfs.cpio"
	log "initramfs: $(du -m "$KC/initramfs.cpio" | cut -f1) MiB"
}

install_deps
command -v qemu-system-x86_64 >/dev/null || skip "no qemu-system-x86_64 (QEMU >= $QEMU_MIN_MAJOR.0 from bookworm-backports could not be installed)"
[[ $(qemu_major) -ge $QEMU_MIN_MAJOR ]] || skip "QEMU $(qemu-system-x86_64 --version | head -1) has no igb SR-IOV emulation (needs >= $QEMU_MIN_MAJOR.0, bookworm-backports)"
qemu-system-x86_64 -device help 2>/dev/null | grep -q '"igb"' || skip "this QEMU has no -device igb"
mkdir -p "$CACHE"
# One run at a time per $WORK: runs share the kernel, the initramfs and
# the run directory (and two TCG guests on 2 cores time nothing).
exec 9>"$CACHE/lock"
if ! flock -n 9; then
	log "waiting for another make e2e-kernel on $WORK to finish"
	flock 9
fi
kernel_fetch "$CACHE"
mkdir -p "$KC"
log "qemu: $(qemu-system-x86_64 --version | head -1); kernel $KERNEL: $(<"$KDIR/stamp")"
build_go
make_initramfs

rm -rf "$RUN" && mkdir -p "$RUN"
# The guest's way out: a raw disk it writes one tar to (its sysfs capture
# and logs), read here after poweroff.
truncate -s 256M "$RUN/out.raw"

# TCG: /dev/kvm on these machines is a PVM variant that cannot run a stock
# kernel (test/e2e-kernel/README.md). Three igb PFs, each behind its own
# root port: two on one hub (one wire between them), one on user-mode
# networking (an IPv6 default route by RA: the node's own network).
# no_timer_check: under TCG on a loaded host the vCPUs lose time, and the
# kernel's boot-time check that the IO-APIC timer ticks (check_timer) can
# miss the ticks it waits for and panic ("timer doesn't work through
# Interrupt-remapped IO-APIC"), as one 7.3 boot under load did; the timer
# of this emulated q35 works, so the check is skipped (make
# e2e-kernel-boots: 5 boots of 7.3 beside 4 busy loops, no panic).
qemu=(
	qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 2048
	-machine q35,kernel-irqchip=split -device intel-iommu,intremap=on
	-nographic -no-reboot -serial stdio -monitor none
	-kernel "$KERNEL_VMLINUZ" -initrd "$KC/initramfs.cpio"
	-append "console=ttyS0 panic=-1 intel_iommu=on no_timer_check loglevel=4 e2e_checks=${E2E_KERNEL_CHECKS:-} E2E_KERNEL_BENCH_ROUNDS=${E2E_KERNEL_BENCH_ROUNDS:-25}"
	-netdev hubport,id=wire0,hubid=0 -netdev hubport,id=wire1,hubid=0 -netdev user,id=node,ipv6=on
	-device pcie-root-port,id=rp1,chassis=1,slot=1 -device igb,netdev=wire0,bus=rp1,mac=52:54:00:e2:00:01
	-device pcie-root-port,id=rp2,chassis=2,slot=2 -device igb,netdev=wire1,bus=rp2,mac=52:54:00:e2:00:02
	-device pcie-root-port,id=rp3,chassis=3,slot=3 -device igb,netdev=node,bus=rp3,mac=52:54:00:e2:00:03
	-drive file="$RUN/out.raw",format=raw,if=none,id=out -device virtio-blk-pci,drive=out
)
log "booting the guest (TCG, 2 vCPUs; timeout ${QEMU_TIMEOUT}s)"
tboot=$(date +%s)
set +e
timeout -k 10 "$QEMU_TIMEOUT" "${qemu[@]}" </dev/null 2>&1 | sed -u 's/\r$//' | tee "$RUN/console.log"
qrc=${PIPESTATUS[0]}
set -e
guest_s=$(($(date +%s) - tboot))

mkdir -p "$RUN/out"
if tar -xf "$RUN/out.raw" -C "$RUN/out" 2>/dev/null; then
	log "the guest's files: $RUN/out ($(find "$RUN/out" -type f | wc -l) files)"
else
	log "the guest wrote no files"
fi

# The captured sysfs as a fixture host: the tree as the guest's kernel
# made it (relative links), and dev/ with the char devices discovery
# looks for (empty files, as the other fixture hosts have them).
# CAPTURE_TO=DIR (e.g. testdata/sysfs-captured/igb-qemu) replaces DIR with it.
if [[ -d $RUN/out/sys ]]; then
	host=$RUN/igb-qemu
	rm -rf "$host" && mkdir -p "$host/dev/vfio"
	cp -a "$RUN/out/sys" "$host/"
	for g in "$host"/sys/kernel/iommu_groups/*; do
		for d in "$g"/devices/*; do
			[[ -L $d ]] || continue
			if [[ $(readlink "$host/sys/bus/pci/devices/$(basename "$d")/driver" 2>/dev/null) == */vfio-pci ]]; then
				: >"$host/dev/vfio/$(basename "$g")"
				: >"$host/dev/vfio/vfio"
			fi
		done
	done
	log "captured fixture host: $host ($(find "$host" | wc -l) entries)"
	if [[ -n ${CAPTURE_TO:-} ]]; then
		rm -rf "$CAPTURE_TO" && mkdir -p "$(dirname "$CAPTURE_TO")" && cp -a "$host" "$CAPTURE_TO"
		log "copied to $CAPTURE_TO"
	fi
fi

pass=$(grep -c '^PASS ' "$RUN/console.log" || true)
fail=$(grep -c '^FAIL ' "$RUN/console.log" || true)
skipped=$(grep -c '^SKIP: ' "$RUN/console.log" || true)
done_marker=$(grep -c '^E2E-KERNEL-DONE' "$RUN/console.log" || true)
panics=$(grep -c 'Kernel panic' "$RUN/console.log" || true)
echo
echo "failed checks:"
grep '^FAIL ' "$RUN/console.log" || echo "  none"
echo "skipped checks (what kernel $KERNEL lacks):"
grep '^SKIP: ' "$RUN/console.log" || echo "  none"
total_s=$(($(date +%s) - T0))
echo "kernel $KERNEL ($KERNEL_ABI): $pass passed, $fail failed, $skipped skipped"
log "guest run ${guest_s}s, total ${total_s}s (qemu exit $qrc)"
# one line for make e2e-kernel-matrix: kernel abi passed failed skipped seconds done panics
echo "$KERNEL $KERNEL_ABI $pass $fail $skipped $total_s $done_marker $panics" >"$KC/result"
if ((done_marker == 0)); then
	echo "FAIL: the guest died before its last check (no E2E-KERNEL-DONE; qemu exit $qrc): see $RUN/console.log"
	exit 1
fi
((fail == 0 && pass > 0))
exit
}
