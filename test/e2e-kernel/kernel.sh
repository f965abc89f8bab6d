# shellcheck shell=bash
# test/e2e-kernel/kernel.sh: the guest kernels make e2e-kernel boots, for
# any script that boots one of them (source it; it defines functions only).
#
#   source test/e2e-kernel/kernel.sh
#   kernel_select 7.3              # KERNEL_SUITE, KERNEL_ABI, KERNEL_PKG_VERSION
#   kernel_fetch "$WORK/kernel"    # KDIR, KERNEL_VMLINUZ, KERNEL_MODDIR
#
# Each kernel is Debian's own package, pinned, downloaded with apt-get
# download and unpacked with dpkg-deb -x into CACHE/linux-<abi>/ (never
# installed on the host), its modules under KDIR/lib/modules/<abi>/ with a
# modules.dep from depmod -b. The caller may define log, skip (print
# "SKIP: <reason>" and exit 0) and apt_update; these defaults stand in.
#
# Packaging differs by kernel, and this file, not the reader, handles it:
#   5.10 (bullseye), 6.1 (bookworm), 6.12 (bookworm-backports): one
#     linux-image-<abi> package with /boot/vmlinuz-<abi> and
#     /lib/modules/<abi>;
#   7.x (trixie-backports): linux-image-<abi> is empty; linux-binary-<abi>
#     holds /usr/lib/modules/<abi>/vmlinuz, linux-modules-<abi> the modules
#     and linux-base-<abi> modules.builtin, modules.order and config (so
#     the three are unpacked together), and linux-image-amd64's first
#     dependency is linux-base-amd64, not the image.

declare -F log >/dev/null || log() { printf '%s kernel: %s\n' "$(date +%T)" "$*" >&2; }
declare -F skip >/dev/null || skip() {
	echo "SKIP: $*"
	exit 0
}
declare -F apt_update >/dev/null || apt_update() { apt-get update -qq; }

# KERNELS is every kernel kernel_select knows, oldest first.
KERNELS="5.10 6.1 6.12 7.3"
# KERNEL_DEFAULT is make e2e-kernel's kernel when KERNEL is not set.
KERNEL_DEFAULT=6.12

# kernel_select KERNEL sets the suite, ABI and package version of a
# kernel of KERNELS (KERNEL_ABI and KERNEL_PKG_VERSION from the
# environment win: a newer build of the same kernel).
kernel_select() {
	local abi ver
	KERNEL=$1
	case $KERNEL in
	# bullseye's linux-image-amd64 (apt-cache policy -t bullseye linux-image-amd64)
	5.10) KERNEL_SUITE=bullseye abi=5.10.0-32-amd64 ver=5.10.223-1 ;;
	# bookworm-security's, the newest 6.1 of bookworm (apt-cache madison linux-image-amd64)
	6.1) KERNEL_SUITE=bookworm abi=6.1.0-57-amd64 ver=6.1.192-3 ;;
	6.12) KERNEL_SUITE=bookworm-backports abi=6.12.95+deb12-amd64 ver=6.12.95-1~bpo12+1 ;;
	7.3) KERNEL_SUITE=trixie-backports abi=7.3.4+deb13-amd64 ver=7.3.4-1~bpo13+1 ;;
	*)
		echo "KERNEL=$KERNEL: not one of $KERNELS" >&2
		return 1
		;;
	esac
	KERNEL_ABI=${KERNEL_ABI:-$abi}
	KERNEL_PKG_VERSION=${KERNEL_PKG_VERSION:-$ver}
}

# kernel_suite_source adds KERNEL_SUITE on the Debian mirror the machine
# already uses, as a deb822 file, unless some source has it (bookworm and
# its security suite are the machine's own).
kernel_suite_source() {
	local suite=$KERNEL_SUITE f
	if grep -rqsE "(^|[[:space:]])$suite([[:space:]]|$)" /etc/apt/sources.list /etc/apt/sources.list.d/; then
		return 0
	fi
	local mirror
	mirror=$(awk '/^URIs:/ && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
	[[ -n $mirror ]] || mirror=$(awk '$1 == "deb" && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
	[[ -n $mirror ]] || return 1
	f=/etc/apt/sources.list.d/e2e-kernel-$suite.sources
	[[ $suite == bookworm-backports ]] && f=/etc/apt/sources.list.d/backports.sources
	log "adding $suite ($mirror) in $f"
	printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
		"$mirror" "$suite" >"$f"
	APT_UPDATED=
}

# kernel_packages prints the packages that hold ABI's vmlinuz and modules
# at version VER: the split 7.x set when the archive has a
# linux-binary-<abi>, else linux-image-<abi>.
kernel_packages() {
	local abi=$1 ver=$2
	if apt-cache show "linux-binary-$abi=$ver" >/dev/null 2>&1; then
		echo "linux-binary-$abi=$ver linux-modules-$abi=$ver linux-base-$abi=$ver"
	else
		echo "linux-image-$abi=$ver"
	fi
}

# kernel_download DIR ABI VER downloads ABI's packages into DIR.
kernel_download() {
	local dir=$1 pkgs
	pkgs=$(kernel_packages "$2" "$3")
	# shellcheck disable=SC2086 # a list of packages
	(cd "$dir" && apt-get download -o APT::Sandbox::User=root $pkgs >&2)
}

# kernel_fetch CACHE unpacks the selected kernel into CACHE/linux-<abi>
# (cached by a stamp) and sets KDIR, KERNEL_VMLINUZ and KERNEL_MODDIR.
# When the pinned version is gone from the mirror, the one
# linux-image-amd64 depends on in KERNEL_SUITE is taken, and the log says so.
kernel_fetch() {
	local cache=$1
	local want="$KERNEL_ABI=$KERNEL_PKG_VERSION"
	KDIR=$cache/linux-$KERNEL_ABI
	if ! [[ -f $KDIR/stamp && $(<"$KDIR/stamp") == "$want" ]]; then
		command -v apt-get >/dev/null || skip "no apt-get to fetch the guest kernel $KERNEL ($want)"
		local dl=$cache/dl-$KERNEL
		rm -rf "$dl" && mkdir -p "$dl"
		if ! kernel_download "$dl" "$KERNEL_ABI" "$KERNEL_PKG_VERSION"; then
			kernel_suite_source || true
			APT_UPDATED= apt_update || true
			if ! kernel_download "$dl" "$KERNEL_ABI" "$KERNEL_PKG_VERSION"; then
				local meta dep
				meta=$(apt-cache policy -t "$KERNEL_SUITE" linux-image-amd64 2>/dev/null | awk '$1 == "Candidate:" { print $2 }')
				# the image among the dependencies: from 7.x the first is linux-base-amd64
				dep=$(apt-cache show "linux-image-amd64=$meta" 2>/dev/null |
					awk -F': ' '$1 == "Depends" { n = split($2, d, ", "); for (i = 1; i <= n; i++) if (d[i] ~ /^linux-image-[0-9]/) { split(d[i], w, " "); print w[1] "=" substr(w[3], 1, length(w[3]) - 1); exit } }')
				[[ $dep == "linux-image-$KERNEL."* ]] || skip "the guest kernel $KERNEL ($want) is not on the mirror, and $KERNEL_SUITE offers no linux-image-amd64 of $KERNEL"
				KERNEL_ABI=${dep#linux-image-}
				KERNEL_ABI=${KERNEL_ABI%%=*}
				KERNEL_PKG_VERSION=${dep#*=}
				log "WARNING: the pinned kernel $want is not on the mirror; using $KERNEL_ABI=$KERNEL_PKG_VERSION instead (update kernel_select in test/e2e-kernel/kernel.sh)"
				rm -rf "$dl" && mkdir -p "$dl"
				kernel_download "$dl" "$KERNEL_ABI" "$KERNEL_PKG_VERSION" || skip "cannot download the guest kernel $KERNEL_ABI=$KERNEL_PKG_VERSION"
				want="$KERNEL_ABI=$KERNEL_PKG_VERSION"
				KDIR=$cache/linux-$KERNEL_ABI
			fi
		fi
		log "unpacking $(cd "$dl" && echo *.deb)"
		rm -rf "$KDIR" && mkdir -p "$KDIR"
		local d
		for d in "$dl"/*.deb; do
			dpkg-deb -x "$d" "$KDIR"
		done
		# 7.x is merged-/usr (usr/lib/modules); depmod -b looks in lib/modules
		if [[ -d $KDIR/usr/lib/modules && ! -e $KDIR/lib/modules ]]; then
			mkdir -p "$KDIR/lib" && mv "$KDIR/usr/lib/modules" "$KDIR/lib/modules"
		fi
		depmod -b "$KDIR" "$KERNEL_ABI"
		rm -rf "$dl"
		echo "$want" >"$KDIR/stamp"
	fi
	KERNEL_MODDIR=$KDIR/lib/modules/$KERNEL_ABI
	KERNEL_VMLINUZ=$KDIR/boot/vmlinuz-$KERNEL_ABI
	[[ -f $KERNEL_VMLINUZ ]] || KERNEL_VMLINUZ=$KERNEL_MODDIR/vmlinuz
	[[ -f $KERNEL_VMLINUZ ]] || skip "the guest kernel $want has no vmlinuz in $KDIR"
	return 0
}

# kernel_has_module NAME says whether the unpacked kernel has module NAME
# as a file (modules.dep) or built in (modules.builtin).
kernel_has_module() {
	local re="/${1//[-_]/[-_]}\.ko(\.xz|\.zst|\.gz)?"
	grep -qE "$re:" "$KERNEL_MODDIR/modules.dep" || grep -qE "$re\$" "$KERNEL_MODDIR/modules.builtin" 2>/dev/null
}

# verbs_tool_paths prints the RDMA tools' files a guest gets from the
# host's Debian packages: rdma-core's ibv_rc_pingpong (ibverbs-utils) and
# perftest's ib_write_bw (their real paths), rdma-core's soft-RoCE
# provider (ibverbs-providers) and its driver file; it fails, naming the
# package, when one is missing.
verbs_tool_paths() {
	local t prov
	for t in ibv_rc_pingpong ib_write_bw; do
		t=$(type -P "$t") || { echo "no $t (ibverbs-utils, perftest)" >&2; return 1; }
		readlink -f "$t"
	done
	prov=$(dpkg -L ibverbs-providers 2>/dev/null | grep '/librxe-rdmav[0-9]*\.so$' | head -1)
	[[ -n $prov && -f /etc/libibverbs.d/rxe.driver ]] || { echo "no rxe provider (ibverbs-providers)" >&2; return 1; }
	echo "$prov"
	echo /etc/libibverbs.d/rxe.driver
}

# copy_verbs_tools copies those files into $ROOT, the tools and the
# provider with the libraries they need, the tools also as /usr/bin/NAME
# (only rxe's provider: libibverbs would warn about every other one it
# cannot load).
copy_verbs_tools() {
	local paths f
	paths=$(verbs_tool_paths) || return 1
	for f in $paths; do
		case $f in
		*.driver) install -D -m 0644 "$f" "$ROOT$f" ;;
		*.so) copy_with_libs "$f" ;;
		*)
			copy_with_libs "$f"
			[[ -e $ROOT/usr/bin/$(basename "$f") ]] || ln -s "$f" "$ROOT/usr/bin/$(basename "$f")"
			;;
		esac
	done
}

# copy_with_libs copies an executable and the libraries ldd names into
# $ROOT (the initramfs being made; make e2e-kernel's and make
# e2e-vm-cluster's guests).
copy_with_libs() {
	local f=$1 l
	install -D -m 0755 "$f" "$ROOT$f"
	for l in $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*' | sort -u); do
		[[ -e $ROOT$l ]] || install -D -m 0755 "$(readlink -f "$l")" "$ROOT$l"
	done
}
