#!/usr/bin/env bash
# make e2e-kernel: fastpath inside a real Linux kernel with emulated SR-IOV
# NICs. QEMU (>= 8.0, TCG) boots Debian's own bookworm-backports kernel
# with three Intel 82576 (igb) PFs behind PCIe root ports and an IOMMU;
# an initramfs holds busybox, iproute2, the product's static binaries, the
# CNI reference IPAM plugins, the guest check program (test/e2e-kernel/guest)
# and the kernel modules it needs. The guest prints one PASS or FAIL line
# per check; this script counts them. See test/e2e-kernel/README.md.
#
# Everything fetched or built is cached under $WORK/kernel (WORK defaults
# to .e2e-work, git-ignored); only a run's own files are remade. When QEMU
# or the kernel cannot be had it prints "SKIP: <reason>" and exits 0.
#
# Usage: test/e2e-kernel/run.sh   (as root; WORK, KERNEL_ABI, KERNEL_PKG_VERSION,
#                                  QEMU_TIMEOUT, E2E_KERNEL_CHECKS override the defaults;
#                                  E2E_KERNEL_BENCH_BINS and _ROUNDS are bench-cni.sh's;
#                                  E2E_KERNEL_SRC builds the binaries from another checkout)
set -euo pipefail

DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$DIR/../.." && pwd)
WORK=${WORK:-$REPO/.e2e-work}
CACHE=$WORK/kernel
RUN=$CACHE/run

# The pinned guest kernel: the package linux-image-amd64 depends on in
# bookworm-backports (apt-cache policy linux-image-amd64 -t bookworm-backports).
KERNEL_ABI=${KERNEL_ABI:-6.12.95+deb12-amd64}
KERNEL_PKG_VERSION=${KERNEL_PKG_VERSION:-6.12.95-1~bpo12+1}
# QEMU 8.0 is the first with -device igb (SR-IOV); bookworm-backports has
# 10.0.2 (the version this tier was measured on).
QEMU_PKG_VERSION=${QEMU_PKG_VERSION:-1:10.0.2+ds-2+deb13u1~bpo12+1}
QEMU_MIN_MAJOR=8
# The whole guest run, boot to poweroff; it takes 2-4 minutes on 2 cores.
QEMU_TIMEOUT=${QEMU_TIMEOUT:-900}
# The modules the guest loads (their dependencies come from modules.dep).
MODULES="igb igbvf vfio-pci rdma_rxe ib_uverbs rdma_ucm crc32_generic virtio_blk veth"
# Debian's busybox-static, iproute2 and util-linux's setpriv are what the
# guest's userland is.
DEBS_NEEDED="busybox-static kmod xz-utils cpio iproute2 util-linux"

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

# fetch_kernel unpacks the pinned kernel package into $KDIR (never
# installed on the host) and runs depmod over it; cached by a stamp. When
# the pinned version is gone from the mirror, the one linux-image-amd64
# depends on in bookworm-backports is taken, and the log says so.
fetch_kernel() {
	local want="linux-image-$KERNEL_ABI=$KERNEL_PKG_VERSION"
	KDIR=$CACHE/linux-$KERNEL_ABI
	if [[ -f $KDIR/stamp && $(<"$KDIR/stamp") == "$want" ]]; then
		return 0
	fi
	command -v apt-get >/dev/null || skip "no apt-get to fetch the guest kernel package $want"
	local dl=$CACHE/dl
	rm -rf "$dl" && mkdir -p "$dl"
	if ! (cd "$dl" && apt-get download -o APT::Sandbox::User=root "$want" >&2); then
		backports_sources || true
		APT_UPDATED= apt_update || true
		if ! (cd "$dl" && apt-get download -o APT::Sandbox::User=root "$want" >&2); then
			local dep meta
			meta=$(apt-cache policy -t bookworm-backports linux-image-amd64 2>/dev/null | awk '$1 == "Candidate:" { print $2 }')
			dep=$(apt-cache show "linux-image-amd64=$meta" 2>/dev/null |
				awk -F': ' '$1 == "Depends" { split($2, d, " "); print d[1] "=" substr(d[3], 1, length(d[3]) - 1); exit }')
			[[ $dep == linux-image-6.* ]] || skip "the guest kernel $want is not on the mirror, and bookworm-backports offers no linux-image-amd64"
			log "WARNING: the pinned kernel $want is not on the mirror; using $dep instead (update KERNEL_ABI/KERNEL_PKG_VERSION in test/e2e-kernel/run.sh)"
			(cd "$dl" && apt-get download -o APT::Sandbox::User=root "$dep" >&2) || skip "cannot download the guest kernel $dep"
			want=$dep
			KERNEL_ABI=${dep#linux-image-}
			KERNEL_ABI=${KERNEL_ABI%%=*}
			KDIR=$CACHE/linux-$KERNEL_ABI
		fi
	fi
	log "unpacking $want"
	rm -rf "$KDIR" && mkdir -p "$KDIR"
	dpkg-deb -x "$dl"/linux-image-*.deb "$KDIR"
	depmod -b "$KDIR" "$KERNEL_ABI"
	rm -rf "$dl"
	echo "$want" >"$KDIR/stamp"
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

# copy_with_libs copies an executable and the libraries ldd names into $ROOT.
copy_with_libs() {
	local f=$1 l
	install -D -m 0755 "$f" "$ROOT$f"
	for l in $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*' | sort -u); do
		[[ -e $ROOT$l ]] || install -D -m 0755 "$(readlink -f "$l")" "$ROOT$l"
	done
}

# module_paths prints the modules' files and their dependencies, in
# modules.dep's relative form.
module_paths() {
	local dep=$KDIR/lib/modules/$KERNEL_ABI/modules.dep m line
	for m in $MODULES; do
		line=$(grep -E "/${m//[-_]/[-_]}\.ko(\.xz|\.zst|\.gz)?:" "$dep") || die "module $m is not in $dep"
		echo "$line" | tr -d ':' | tr ' ' '\n'
	done | sort -u
}

# make_initramfs stages the guest's root and packs it (newc, uncompressed:
# TCG pays for every decompressed byte).
make_initramfs() {
	ROOT=$CACHE/root
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
	local setpriv
	setpriv=$(command -v setpriv) || die "no setpriv (util-linux)"
	copy_with_libs "$(readlink -f "$setpriv")"
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
		*.xz) xz -dc "$KDIR/lib/modules/$KERNEL_ABI/$m" >"$mods/${m%.xz}" ;;
		*) cp "$KDIR/lib/modules/$KERNEL_ABI/$m" "$mods/$m" ;;
		esac
	done
	cp "$KDIR/lib/modules/$KERNEL_ABI"/modules.{builtin,builtin.modinfo,order} "$mods/" 2>/dev/null || true
	depmod -b "$ROOT" "$KERNEL_ABI"
	echo "root:x:0:0:root:/root:/bin/sh" >"$ROOT/etc/passwd"
	echo "$KERNEL_ABI" >"$ROOT/etc/kernel-abi"
	(cd "$ROOT" && find . -print0 | cpio --null -o -H newc --quiet) >"$CACHE/initramfs.cpio"
	log "initramfs: $(du -m "$CACHE/initramfs.cpio" | cut -f1) MiB"
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
fetch_kernel
log "qemu: $(qemu-system-x86_64 --version | head -1); kernel: $(<"$KDIR/stamp")"
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
qemu=(
	qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 2048
	-machine q35,kernel-irqchip=split -device intel-iommu,intremap=on
	-nographic -no-reboot -serial stdio -monitor none
	-kernel "$KDIR/boot/vmlinuz-$KERNEL_ABI" -initrd "$CACHE/initramfs.cpio"
	-append "console=ttyS0 panic=-1 intel_iommu=on loglevel=4 e2e_checks=${E2E_KERNEL_CHECKS:-} E2E_KERNEL_BENCH_ROUNDS=${E2E_KERNEL_BENCH_ROUNDS:-25}"
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
done_marker=$(grep -c '^E2E-KERNEL-DONE' "$RUN/console.log" || true)
echo
echo "failed checks:"
grep '^FAIL ' "$RUN/console.log" || echo "  none"
echo "$pass passed, $fail failed"
log "guest run ${guest_s}s, total $(($(date +%s) - T0))s (qemu exit $qrc)"
if ((done_marker == 0)); then
	echo "FAIL: the guest died before its last check (no E2E-KERNEL-DONE; qemu exit $qrc): see $RUN/console.log"
	exit 1
fi
((fail == 0 && pass > 0))
