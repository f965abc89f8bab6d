# shellcheck shell=bash
# Helpers shared by the e2e scripts (sourced, not run).
#
# Layout under $WORK (default $REPO/.e2e-work, git-ignored):
#   bin/            kubelet, containerd, ctr, the runc shim, our binaries; kept between runs
#   cni-plugins/    CNI reference plugins; kept between runs
#   kubelet-build/  scratch Go module that builds the kubelet (never this repo's go.mod)
#   image/          the locally built pause image (OCI layout tar)
#   run/            one run's state and logs; wiped when the next run starts

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$E2E_DIR/../.." && pwd)
WORK=${WORK:-$REPO/.e2e-work}
RUN=$WORK/run

# Pinned versions of what the test builds from the Go module proxy.
K8S_VERSION=${K8S_VERSION:-v1.37.2}
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
