# shellcheck shell=bash
# Helpers shared by the e2e scripts (sourced, not run).
#
# Layout under $WORK (default $REPO/.e2e-work, git-ignored):
#   bin/            kubelet, containerd, ctr, the runc shim, our binaries; kept between runs
#   cni-plugins/    CNI reference plugins; kept between runs
#   k8s-build/      scratch Go module that builds the kubelet and the control plane (never this repo's go.mod)
#   image/          the locally built pause image (OCI layout tar)
#   run/            one run's state and logs; wiped when the next run starts

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$E2E_DIR/../.." && pwd)
WORK=${WORK:-$REPO/.e2e-work}
RUN=$WORK/run

# Pinned versions of what the test builds from the Go module proxy.
K8S_VERSION=${K8S_VERSION:-v1.37.2}
# What the k8s-build module covers: make e2e builds the kubelet, make
# e2e-cluster the rest, from one go.sum.
K8S_COMPONENTS="kubelet kube-apiserver kube-controller-manager kube-scheduler kubectl"
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CNI_PLUGINS_VERSION=${CNI_PLUGINS_VERSION:-v1.10.0}

# shellcheck disable=SC2034 # used by the scripts that source this file
PAUSE_IMAGE=localhost/fastpath-e2e/pause:1

export PATH=/usr/local/go/bin:$PATH

log() { printf '%s e2e: %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# elapsed prints seconds since the given epoch (date +%s.%N), one decimal.
elapsed() { awk -v t0="$1" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.1f", t1 - t0 }'; }

# wait_for TIMEOUT DESCRIPTION CMD... polls CMD every 0.25s until it
# succeeds or TIMEOUT seconds pass. Polling with a bound is the only
# synchronisation the components offer (no readiness events).
wait_for() {
	local timeout=$1 what=$2 t0
	shift 2
	t0=$(date +%s.%N)
	local deadline=$(($(date +%s) + timeout))
	while true; do
		if "$@" >/dev/null 2>&1; then
			log "ok: $what ($(elapsed "$t0")s)"
			return 0
		fi
		if (($(date +%s) >= deadline)); then
			log "timeout after ${timeout}s: $what"
			return 1
		fi
		sleep 0.25
	done
}

# shared_root DIR [PREFIX...] makes DIR, the kubelet's root dir, a mount
# point with shared propagation before the kubelet starts, as it is on a
# node whose / is shared (systemd's default); PREFIX runs the commands
# elsewhere (nsenter into a node's mount namespace). On a private mount the
# kubelet bind-mounts its root onto itself at start (MakeRShared, called
# from initializeModules) while another goroutine creates the pods API
# socket inside it: the socket's rename then crosses the new mount, fails
# with EXDEV, and the kubelet exits ("Failed to create listener for pods API
# endpoint", os.Exit(1) in pkg/kubelet/server ListenAndServePodsServer,
# v1.37.2). Seen once in a CI run of make e2e under load. The cleanup
# unmounts it with the kubelet's other mounts.
shared_root() {
	local dir=$1
	shift
	"$@" sh -ec "mountpoint -q '$dir' || mount --bind '$dir' '$dir'; mount --make-rshared '$dir'"
}

# start NAME CMD... starts CMD in the background with its output in
# $RUN/logs/NAME.log and records its PID in $RUN/pids/NAME, so that cleanup
# can stop exactly this process and nothing else.
start() {
	local name=$1
	shift
	mkdir -p "$RUN/logs" "$RUN/pids"
	"$@" >>"$RUN/logs/$name.log" 2>&1 &
	echo $! >"$RUN/pids/$name"
	log "started $name (pid $!)"
}

# stop NAME stops the process recorded by start: SIGTERM, up to 10s, then
# SIGKILL. It only signals the PID if that process still runs the binary we
# started (/proc/PID/exe), so a PID reused after a crash is left alone.
stop() {
	local name=$1 f=$RUN/pids/$1 pid exe
	[[ -f $f ]] || return 0
	pid=$(<"$f")
	exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
	if [[ -n $exe && $exe == "$WORK"/* ]]; then
		kill -TERM "$pid" 2>/dev/null || true
		local i
		for ((i = 0; i < 40; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.25
		done
		if kill -0 "$pid" 2>/dev/null; then
			log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
		# Reap it if it is our child, so that the next start sees a free socket.
		wait "$pid" 2>/dev/null || true
		log "stopped $name (pid $pid)"
	fi
	rm -f "$f"
}

# running NAME succeeds while the process recorded by start is alive.
running() {
	local f=$RUN/pids/$1
	[[ -f $f ]] && kill -0 "$(<"$f")" 2>/dev/null
}

# ------------------------------------------------------------ test results
# pass/fail/skip record one line of the PASS/FAIL table the test prints at
# the end (summary, in each run.sh).

RESULTS=()
FAILED=0

pass() {
	RESULTS+=("PASS:    $*")
	log "PASS: $*"
}
fail() {
	RESULTS+=("FAIL:    $*")
	log "FAIL: $*"
	FAILED=1
}
skip() {
	RESULTS+=("SKIPPED: $*")
	log "SKIPPED: $*"
}

# phase TITLE heads the checks that follow in the table.
phase() {
	RESULTS+=("---- $*")
	log "---- $*"
}

# check DESCRIPTION CMD... records PASS or FAIL and goes on: later checks
# still tell something. Steps that later ones depend on use require.
check() {
	local what=$1
	shift
	if "$@"; then
		pass "$what"
	else
		fail "$what"
	fi
}

# expect DESCRIPTION WANT GOT compares two strings, like check.
expect() {
	if [[ $2 == "$3" ]]; then
		pass "$1: $3"
	else
		fail "$1: want '$2', got '$3'"
	fi
}

# require DESCRIPTION TIMEOUT CMD... waits for CMD; when it never succeeds
# the run stops here (later steps depend on it), with the logs' tails.
# REQUIRE_DUMP, when set (REQUIRE_DUMP=fn require ...), names a function
# that writes more state first and prints where it put it.
require() {
	local what=$1 timeout=$2 note=
	shift 2
	if wait_for "$timeout" "$what" "$@"; then
		pass "$what"
		return 0
	fi
	[[ -z ${REQUIRE_DUMP:-} ]] || note="; $("$REQUIRE_DUMP")"
	fail "$what (within ${timeout}s$note)"
	show_logs
	exit 1
}

show_logs() {
	local f
	for f in "$RUN"/logs/*.log; do
		[[ -f $f ]] || continue
		echo "---- last lines of $f" >&2
		tail -n 25 "$f" >&2
	done
}

# same DESCRIPTION FILE CMD... compares CMD's output with FILE, like check;
# a failure names what was added (+) and removed (-).
same() {
	local what=$1 want=$2 got
	shift 2
	got=$("$@")
	if [[ $got == "$(cat "$want" 2>/dev/null)" ]]; then
		pass "$what"
	else
		fail "$what: $(diff <(cat "$want" 2>/dev/null) <(echo -n "$got${got:+$'\n'}") | sed -n 's/^> /+/p; s/^< /-/p' | xargs)"
	fi
}

# summary prints every check's result under $SUMMARY_TITLE, then PASS or
# FAIL.
summary() {
	local r
	echo
	echo "==== $SUMMARY_TITLE ===="
	for r in "${RESULTS[@]}"; do echo "$r"; done
	if ((FAILED)); then
		echo "==== FAIL (logs: $RUN/logs) ===="
	else
		echo "==== PASS ===="
	fi
}

# on_exit is both tests' EXIT trap: once the host's state was recorded
# ($RUN/before), the sourcing script's cleanup puts it back and its
# check_restored compares; then the summary, and a failed run's status.
on_exit() {
	local rc=$?
	trap - EXIT INT TERM
	if [[ -f $RUN/before/links ]]; then
		log "cleaning up"
		cleanup
		check_restored || true
		rm -rf "$RUN/before"
	fi
	((rc == 0)) || fail "the run stopped early (exit status $rc)"
	summary
	((FAILED == 0)) || exit 1
}

# jq_true ARGS... is jq -e ARGS on standard input, and false when there is
# no input at all: jq 1.6 (Debian 12's) exits 0 on empty input even with
# -e, so a check on the output of a command that failed and printed
# nothing would pass.
jq_true() {
	local in
	in=$(cat)
	[[ -n ${in//[[:space:]]/} ]] || return 1
	jq -e "$@" >/dev/null <<<"$in"
}

# ------------------------------------------------------------- components
# Both tests run containerd and the kubelet the same way; what differs (the
# CNI directories, the images, static pods or an API server) is theirs.

# start_containerd_with CNI_BIN_DIR CNI_CONF_DIR runs containerd on a
# private socket ($CTRD_SOCK) with every directory under $C, except the
# ones it hard-codes: shim sockets in /run/containerd/s and pod netns in
# /run/netns/cni-*.
start_containerd_with() {
	mkdir -p "$C"
	cat >"$C/config.toml" <<EOF
version = 3
root = "$C/root"
state = "$C/state"
[grpc]
  address = "$CTRD_SOCK"
[ttrpc]
  address = "$CTRD_SOCK.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$C/opt"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    # the locally imported pause image; there is no registry to pull from
    sandbox = "$PAUSE_IMAGE"
[plugins."io.containerd.cri.v1.runtime"]
  # Machines here drop CAP_SYS_RESOURCE, so writing the sandbox's
  # oom_score_adj (-998) fails and runc dies with "can't get final child's
  # PID from pipe: EOF". This clamps it to containerd's own. Harmless elsewhere.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
        Root = "$C/runc"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$1"]
    conf_dir = "$2"
    max_conf_num = 1
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
	# containerd hands its environment to the CNI plugins it runs: that is
	# how our sriov plugin reads the fixture's sysfs instead of the host's
	# (FASTPATH_HOST_ROOT), and the sriov plugin's node config where the
	# caller set FASTPATH_CNI_NODE_CONFIG (test/e2e; e2e-cluster's nodes
	# use the default paths). It finds containerd-shim-runc-v2 through PATH.
	# make e2e-cluster's namespaced nodes name their own process
	# (CTRD_PROC) and start it inside the node (NODE_EXEC, nsenter).
	start "${CTRD_PROC:-containerd}" ${NODE_EXEC[@]+"${NODE_EXEC[@]}"} env PATH="$WORK/bin:$PATH" FASTPATH_HOST_ROOT="$HOST" \
		${FASTPATH_CNI_NODE_CONFIG:+FASTPATH_CNI_NODE_CONFIG="$FASTPATH_CNI_NODE_CONFIG"} \
		"$WORK/bin/containerd" --config "$C/config.toml" --log-level info
	require "containerd answers on its socket" 30 ctr version
}

# kubelet_config POD_LOGS_DIR VOLUME_PLUGIN_DIR prints what both tests'
# KubeletConfiguration has: containerd at $CTRD_SOCK, cgroupfs, no kubelet
# server (only /healthz on localhost, $HEALTHZ_PORT), the host's iptables
# left alone, never an eviction. Each test adds its own lines.
kubelet_config() {
	cat <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CTRD_SOCK
imageServiceEndpoint: unix://$CTRD_SOCK
podLogsDir: $1
volumePluginDir: $2
# No kubelet server (so no kubectl logs/exec): the tests read containers
# from the host. Only /healthz, on localhost.
enableServer: false
healthzBindAddress: 127.0.0.1
healthzPort: $HEALTHZ_PORT
readOnlyPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
# Leave the host's iptables alone (KUBE-IPTABLES-HINT, KUBE-FIREWALL).
makeIPTablesUtilChains: false
failSwapOn: false
resolvConf: /etc/resolv.conf
# A test machine's disk may be fuller than the defaults allow; never evict.
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
}

# ---------------------------------------------------------------- clean-up
# Both tests' cleanup stops the node and puts the host back the same way;
# each adds what only it started or changed.

# What both tests record before they start (snapshot_host) and put back:
# pod netns (cni-*), HOST_PATHS, cgroups, the KUBELET_SYSCTLS.
# sysctl_get/sysctl_set go through /proc/sys: procps is not on every machine.
sysctl_get() { cat "/proc/sys/${1//.//}"; }
sysctl_set() { echo "$2" >"/proc/sys/${1//.//}"; }
host_netns() { ip netns list 2>/dev/null | awk '$1 ~ /^cni-/ { print $1 }' | sort; }
host_paths() {
	local p
	for p in "${HOST_PATHS[@]}"; do [[ -e $p ]] && echo "$p"; done
	return 0
}
host_cgroups() {
	local d
	for d in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
		[[ -d $d ]] && find "$d" -mindepth 1 -maxdepth 1 -type d 2>/dev/null
	done | sort
}
host_sysctls() {
	local s
	for s in "${KUBELET_SYSCTLS[@]}"; do echo "$s=$(sysctl_get "$s")"; done
}

# snapshot_common records in $RUN/before what both tests put back: their
# links (host_links, each test's own), pod netns, cgroups, HOST_PATHS and
# the sysctls.
snapshot_common() {
	mkdir -p "$RUN/before"
	host_links >"$RUN/before/links"
	host_netns >"$RUN/before/netns"
	host_cgroups >"$RUN/before/cgroups"
	host_paths >"$RUN/before/paths"
	host_sysctls >"$RUN/before/sysctls"
}

# stop_containers stops containerd and what it ran: the containers the
# kubelet left, killed through runc (containerd keeps runc's state under
# the Root we gave it, per namespace), containerd itself, and the shims,
# which outlive containerd by design (ours run
# $WORK/bin/containerd-shim-runc-v2). The kubelet is stopped before.
stop_containers() {
	local rroot=$C/runc/k8s.io id p
	if [[ -d $rroot ]]; then
		for id in $(runc --root "$rroot" list -q 2>/dev/null); do
			runc --root "$rroot" kill "$id" KILL 2>/dev/null
			runc --root "$rroot" delete --force "$id" 2>/dev/null
		done
	fi
	stop containerd
	for p in /proc/[0-9]*; do
		if [[ $(readlink "$p/exe" 2>/dev/null) == "$WORK/bin/containerd-shim-runc-v2" ]]; then
			kill -KILL "${p#/proc/}" 2>/dev/null && log "killed leftover shim ${p#/proc/}"
		fi
	done
	rm -rf "$RUN/pids"
}

# remove_mounts_netns_standins MOUNTS_CMD unmounts what MOUNTS_CMD lists
# (overlay rootfs, sandbox shm, volumes), deepest first, deletes the pod
# netns containerd made during the run ($RUN/before/netns has the others)
# and the stand-in veths ($RUN/standins).
remove_mounts_netns_standins() {
	local m name peer
	for m in $("$1" | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m"
	done
	if [[ -f $RUN/before/netns ]]; then
		for m in $(comm -13 "$RUN/before/netns" <(host_netns)); do
			ip netns delete "$m" && log "deleted leftover netns $m"
		done
	fi
	if [[ -f $RUN/standins ]]; then
		while read -r name peer; do
			ip link del "$name" 2>/dev/null || ip link del "$peer" 2>/dev/null
		done <"$RUN/standins"
	fi
	return 0
}

# restore_host_paths_and_kernel removes the paths of HOST_PATHS that were
# not there before ($RUN/before/paths) and the cgroups the run made, and
# puts back the sysctls the kubelet set.
restore_host_paths_and_kernel() {
	local before=$RUN/before p m kv
	if [[ -f $before/paths ]]; then
		for p in "${HOST_PATHS[@]}"; do
			grep -qxF "$p" "$before/paths" && continue
			if [[ $p == /run/netns ]]; then
				# `ip netns` turns /run/netns into a bind mount of itself.
				[[ -z $(ls -A /run/netns 2>/dev/null) ]] || continue
				mountpoint -q /run/netns && umount /run/netns
			fi
			rm -rf "$p"
		done
	fi
	if [[ -f $before/cgroups ]]; then
		for m in $(comm -13 "$before/cgroups" <(host_cgroups)); do
			find "$m" -depth -type d -exec rmdir {} + 2>/dev/null
		done
	fi
	if [[ -f $before/sysctls ]]; then
		while read -r kv; do
			[[ $(sysctl_get "${kv%%=*}") == "${kv#*=}" ]] || sysctl_set "${kv%%=*}" "${kv#*=}"
		done <"$before/sysctls"
	fi
	return 0
}
