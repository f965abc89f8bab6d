#!/usr/bin/env bash
# End-to-end test on a real kubelet: the upstream kubelet (standalone, static
# pods, no API server), containerd and runc run a pod that asks for
# mellanox.com/mlnx_sriov_rdma; our rdma-device-plugin serves the DGX H100
# fixture host and our sriov CNI moves the VF's netdev (a veth stand-in)
# into the pod. Its provisioning phase (provision.sh) has the plugin create
# the VFs of the seed's SriovNetworkNodePolicy on a host without any, the
# kernel played by kernel-standin. See test/e2e/README.md for what it
# asserts and why.
#
# Usage (root): make e2e   or   test/e2e/run.sh
# Env: WORK (default $REPO/.e2e-work); the versions in lib.sh; E2E_CNI=bridge
#      runs the pod on the reference bridge plugin instead of ours.
#
# Everything it starts is stopped by PID, and everything it changes on the
# host is put back, on exit — also when a step fails or on Ctrl-C.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/provision.sh"

HOST=$RUN/host                          # copy of the fixture host, with real char devices
CONFIG=$REPO/testdata/config/combined.json
RESOURCE=mellanox.com/mlnx_sriov_rdma
RESOURCE_ENV=PCIDEVICE_MELLANOX_COM_MLNX_SRIOV_RDMA
WANT_VFS=32                             # VFs of the fixture in $RESOURCE
NODE="fastpath-e2e"
POD_NS=default
POD="rdma-e2e"
STATIC_POD=$POD-$NODE                   # the kubelet suffixes static pods with the node name
K=$RUN/kubelet
C=$RUN/containerd
CTRD_SOCK=$C/containerd.sock
PODRES_SOCK=$K/root/pod-resources/kubelet.sock
HEALTHZ_PORT=10348
CNI_NET=sriov-rdma
CNI_SUBNET=10.56.0.0/24
CNI_IPAM=$RUN/cni/ipam
CNI_STATE=$RUN/cni-state
FALLBACK_BRIDGE=fpe2e-br0
# The kubelet hard-codes its device plugin directory, whatever --root-dir
# says (pluginapi.DevicePluginPath); it is the one path the test must share
# with a real kubelet, so the test refuses to run when one is there.
DP_DIR=/var/lib/kubelet/device-plugins
# sysctls the kubelet sets on start (setupKernelTunables); put back on exit.
KUBELET_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
# Host paths the components create outside $WORK; removed on exit when they
# were not there before.
HOST_PATHS=(/var/lib/kubelet "$DP_DIR" /var/log/containers /var/log/pods /run/containerd /run/netns /usr/libexec/kubernetes)

# The pod network is our sriov plugin; a tree without cmd/sriov-cni (or
# E2E_CNI=bridge) runs the device plugin part over the reference bridge.
CNI_MODE=${E2E_CNI:-sriov} NO_SRIOV="E2E_CNI=$CNI_MODE"
if [[ ! -d $REPO/cmd/sriov-cni ]]; then
	CNI_MODE=bridge NO_SRIOV="cmd/sriov-cni missing"
fi

# ctr's warnings (cgroup v1 deprecation, on every call) go to its own log.
ctr() { "$WORK/bin/ctr" --address "$CTRD_SOCK" --namespace k8s.io "$@" 2>>"$RUN/logs/ctr.log"; }
podres() { "$WORK/bin/podres" --socket "$PODRES_SOCK" "$@"; }

# ---------------------------------------------------------------- preflight

preflight() {
	if ((EUID != 0)); then
		echo "SKIPPED: make e2e needs root (it runs a kubelet, containerd and runc, makes device nodes and veths)." >&2
		exit 0
	fi
	local missing=() t
	for t in runc ip nsenter mknod curl jq mountpoint tar sha256sum; do
		command -v "$t" >/dev/null || missing+=("$t")
	done
	((${#missing[@]} == 0)) || die "missing tools: ${missing[*]} (Debian: apt-get install runc iproute2 util-linux curl jq coreutils tar)"

	# A previous run killed before its EXIT trap: clean up after it first.
	if [[ -d $RUN/pids || -f $RUN/before/links ]]; then
		log "cleaning up after an interrupted previous run"
		cleanup
	fi
	if [[ -S $DP_DIR/kubelet.sock ]] || [[ -d $DP_DIR && -n $(ls -A "$DP_DIR") ]]; then
		die "$DP_DIR is in use (a kubelet runs here?); the e2e kubelet would empty it. Run on a machine without a kubelet."
	fi
	if curl -s -o /dev/null "http://127.0.0.1:$HEALTHZ_PORT/healthz"; then
		die "port $HEALTHZ_PORT is in use; the e2e kubelet serves /healthz there"
	fi
}

# snapshot_host records what the test may change, so that cleanup puts back
# exactly that and the last check can tell whether it did.
snapshot_host() {
	snapshot_common
	if mountpoint -q /run/netns; then echo yes; else echo no; fi >"$RUN/before/netns-mounted"
}

# host_links and host_netns list what the run may create: the stand-ins and
# their peers, the fallback bridge, pod netns. Other links and netns come and
# go with whatever else runs on the machine.
host_links() {
	ip -o link show | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' |
		{ grep -E "^(ibp[0-9]+s[0-9]+v[0-9]+|sp[0-9]+s[0-9]+v[0-9]+|$FALLBACK_BRIDGE)\$" || true; } | sort
}
host_mounts_in_work() { awk -v w="$WORK/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | sort; }

# ------------------------------------------------------------------- setup

# setup_host copies the fixture host and turns its /dev/infiniband entries
# (plain files in git) into char devices: containerd stats every DeviceSpec
# host path and refuses anything that is not a device node, and runc mknods
# the same major:minor in the container. 1:3 is /dev/null — nothing here
# opens them, and a real RDMA major must never be handed to a container.
setup_host() {
	mkdir -p "$RUN"
	cp -a "$REPO/testdata/sysfs/dgx-h100" "$HOST"
	make_char_devices
	"$WORK/bin/rdma-device-plugin" discover --host-root "$HOST" --config "$CONFIG" -o json >"$RUN/discover.json"
	check "discover on the fixture copy finds $WANT_VFS VFs in $RESOURCE" \
		test "$(jq --arg r "$RESOURCE" '[.pools[] | select(.resource == $r) | .devices[]] | length' "$RUN/discover.json")" = "$WANT_VFS"
}

make_char_devices() {
	local f n=0
	for f in "$HOST"/dev/infiniband/*; do
		rm -f "$f"
		mknod -m 0666 "$f" c 1 3
		n=$((n + 1))
	done
	log "fixture host $HOST: $n char devices (1:3) under /dev/infiniband"
}

# vf_field PCI FIELD prints one field of a device from discover's JSON.
vf_field() { jq -r --arg a "$1" ".devices[] | select(.pciAddress == \$a) | .$2" "$RUN/discover.json"; }

# setup_standins makes one veth pair per VF of the pool, named as the
# fixture's VF netdevs (ibp24s0v0 …): the CNI finds the VF's netdev by that
# name and moves it. The peer (sp24s0v0 …) stays on the host.
setup_standins() {
	local vf name peer
	: >"$RUN/standins"
	for vf in $(jq -r --arg r "$RESOURCE" '.pools[] | select(.resource == $r) | .devices[]' "$RUN/discover.json"); do
		name=$(vf_field "$vf" netdev)
		peer=s${name#ib}
		# Tests of the CNI make links with these names too, briefly; on a
		# shared machine, wait for them to go rather than take one over.
		if ! names_free "$name" "$peer" && ! wait_for 60 "no link named $name or $peer on the host" names_free "$name" "$peer"; then
			die "link $name or $peer exists on this host; the test would take it over"
		fi
		# Recorded before creating, so that cleanup removes a half-made pair.
		echo "$name $peer" >>"$RUN/standins"
		ip link add "$name" type veth peer name "$peer"
		ip link set "$peer" up
		echo "$vf $name $peer $(<"/sys/class/net/$name/address")" >>"$RUN/standins.mac"
	done
	log "stand-ins: $(wc -l <"$RUN/standins") veth pairs named as the VF netdevs"
}

names_free() { ! ip link show "$1" >/dev/null 2>&1 && ! ip link show "$2" >/dev/null 2>&1; }

# write_cni_conf writes the pod's primary network. There is no Multus: the
# sriov plugin is the only network, and eth0 is the VF stand-in.
write_cni_conf() {
	mkdir -p "$RUN/cni/net.d" "$RUN/cni/bin" "$CNI_IPAM"
	ln -s "$WORK"/cni-plugins/* "$RUN/cni/bin/"
	if [[ $CNI_MODE == sriov ]]; then
		ln -s "$WORK/bin/sriov" "$RUN/cni/bin/sriov"
		# No rdmaIsolation: this kernel has no RDMA netlink (no RDMA devices),
		# the plugin can only log that it could not move the RDMA device.
		# The plugin's paths are the node's, not the network's: its node
		# config (root's, 0644), which containerd's environment names
		# (start_containerd_with passes FASTPATH_CNI_NODE_CONFIG on). The
		# kubelet answers PodResources at $PODRES_SOCK; no DRA driver.
		FASTPATH_CNI_NODE_CONFIG=$RUN/cni/sriov-node.json
		cat >"$FASTPATH_CNI_NODE_CONFIG" <<EOF
{"stateDir":"$CNI_STATE","logDir":"$RUN/logs","podResourcesSocket":"$PODRES_SOCK","draSocket":""}
EOF
		chmod 0644 "$FASTPATH_CNI_NODE_CONFIG"
		cat >"$RUN/cni/net.d/10-$CNI_NET.conflist" <<EOF
{"cniVersion":"1.0.0","name":"$CNI_NET","plugins":[
  {"type":"sriov","resourceName":"$RESOURCE",
   "logFile":"$RUN/logs/sriov-cni.log","logLevel":"debug",
   "ipam":{"type":"host-local","ranges":[[{"subnet":"$CNI_SUBNET"}]],"dataDir":"$CNI_IPAM"}}]}
EOF
	else
		# E2E_CNI=bridge, or no cmd/sriov-cni. isGateway off: a gateway makes
		# the bridge plugin turn on net.ipv4.ip_forward on the host.
		cat >"$RUN/cni/net.d/10-$CNI_NET.conflist" <<EOF
{"cniVersion":"1.0.0","name":"$CNI_NET","plugins":[
  {"type":"bridge","bridge":"$FALLBACK_BRIDGE","isGateway":false,"ipMasq":false,
   "ipam":{"type":"host-local","ranges":[[{"subnet":"$CNI_SUBNET"}]],"dataDir":"$CNI_IPAM"}}]}
EOF
	fi
}

# ------------------------------------------------------------- components

# start_containerd: containerd (test/e2e/lib.sh) with the run's own CNI
# directories, and the pause image.
start_containerd() {
	start_containerd_with "$RUN/cni/bin" "$RUN/cni/net.d"
	ctr images import --all-platforms "$WORK/image/pause-oci.tar" >/dev/null
	check "pause image $PAUSE_IMAGE imported" ctr images check "name==$PAUSE_IMAGE"
}

# write_kubelet_config: no API server; the test's pods are static pods.
write_kubelet_config() {
	mkdir -p "$K/root" "$K/manifests" "$K/pod-logs"
	{
		kubelet_config "$K/pod-logs" "$K/volume-plugins"
		cat <<EOF
staticPodPath: $K/manifests
fileCheckFrequency: 2s
EOF
	} >"$K/config.yaml"
}

# start_kubelet [LABEL] starts the kubelet; LABEL tells a restart apart in
# the results.
start_kubelet() {
	local label=${1:-}
	mkdir -p "$DP_DIR"
	shared_root "$K/root"
	start kubelet "$WORK/bin/kubelet" --config "$K/config.yaml" --root-dir "$K/root" \
		--cert-dir "$K/pki" --hostname-override "$NODE" --v=2
	require "kubelet /healthz$label" 90 curl -sf "http://127.0.0.1:$HEALTHZ_PORT/healthz"
	require "kubelet registration socket $DP_DIR/kubelet.sock$label" 30 test -S "$DP_DIR/kubelet.sock"
}

start_device_plugin() {
	start rdma-device-plugin "$WORK/bin/rdma-device-plugin" --config "$CONFIG" --host-root "$HOST" --node-root "$HOST" \
		--kubelet-dir "$DP_DIR" --devinfo-dir "$RUN/devinfo" --metrics-addr 127.0.0.1:0 --log-level debug
	require "device plugin serves /metrics" 30 metrics_addr
	METRICS=http://$(metrics_addr)/metrics
}

# metrics_addr prints the address the plugin bound (--metrics-addr :0).
metrics_addr() {
	local a
	a=$(jq -r 'select(.msg == "serving /healthz and /metrics") | .addr' "$RUN/logs/rdma-device-plugin.log" 2>/dev/null | tail -n1)
	[[ -n $a ]] && echo "$a"
}

# metric NAME LABELS prints a counter's value (0 when absent).
metric() {
	curl -sf "$METRICS" | awk -v n="$1{$2}" '$1 == n { v = $2 } END { print v + 0 }'
}

# --------------------------------------------------------------- the tests

allocatable_count() { podres allocatable --resource "$RESOURCE" | wc -l; }
advertised() { [[ $(allocatable_count) == "$WANT_VFS" ]]; }

test_advertised() {
	require "kubelet advertises $WANT_VFS x $RESOURCE (PodResources GetAllocatableResources)" 60 advertised
	expect "device plugin registrations with the kubelet" 1 "$(registrations)"
}

# pod_tasks counts running containerd tasks: the pod's sandbox and app are
# the only ones this private containerd has.
pod_tasks() { ctr tasks ls | awk 'NR > 1 && $3 == "RUNNING"' | wc -l; }

# app_pid prints the host PID of the pod's running app container.
app_pid() {
	local ids
	ids=$(ctr containers ls -q 'labels."io.kubernetes.container.name"==app' | xargs)
	[[ -n $ids ]] && ctr tasks ls | awk -v ids=" $ids " 'index(ids, " " $1 " ") && $3 == "RUNNING" { print $2 }' | grep .
}

start_pod() {
	# Written elsewhere and renamed in, so that the kubelet's inotify never
	# sees half a file; only now, after the plugin registered, so that the
	# kubelet admits the pod against a known resource.
	cat >"$K/$POD.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $POD
  namespace: $POD_NS
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: $PAUSE_IMAGE
    imagePullPolicy: Never
    resources:
      limits:
        $RESOURCE: "1"
EOF
	ALLOCS_BEFORE=$(metric fastpath_device_plugin_allocated_devices_total "resource=\"$RESOURCE\"")
	mv "$K/$POD.yaml" "$K/manifests/$POD.yaml"
	require "pod $STATIC_POD running (sandbox + app)" 120 app_pid
}

test_pod_devices() {
	expect "device plugin allocated devices (fastpath_device_plugin_allocated_devices_total)" $((ALLOCS_BEFORE + 1)) \
		"$(metric fastpath_device_plugin_allocated_devices_total "resource=\"$RESOURCE\"")"
	check "device plugin logged the Allocate" grep -q '"msg":"allocate"' "$RUN/logs/rdma-device-plugin.log"

	VF=$(podres list --pod "$POD_NS/$STATIC_POD" --resource "$RESOURCE" | cut -f4)
	if [[ $(wc -w <<<"$VF") != 1 ]]; then
		fail "PodResources List gives $STATIC_POD one VF: got '$VF'"
		exit 1
	fi
	pass "PodResources List gives $STATIC_POD one VF: $VF"
	local rdma want_devs got_devs env
	rdma=$(vf_field "$VF" rdmaDevice)
	PID=$(app_pid)
	env=$(tr '\0' '\n' <"/proc/$PID/environ")
	expect "container env $RESOURCE_ENV" "$VF" "$(sed -n "s/^$RESOURCE_ENV=//p" <<<"$env")"
	expect "container env NCCL_IB_HCA" "=$rdma:1" "$(sed -n 's/^NCCL_IB_HCA=//p' <<<"$env")"
	expect "container env UCX_NET_DEVICES" "$rdma:1" "$(sed -n 's/^UCX_NET_DEVICES=//p' <<<"$env")"
	check "container env ${RESOURCE_ENV}_INFO names $VF" \
		test "$(sed -n "s/^${RESOURCE_ENV}_INFO=//p" <<<"$env" | jq -r --arg a "$VF" '.[$a].rdmaDevice')" = "$rdma"

	# The container's /dev/infiniband holds the VF's char devices and no
	# other (not another VF's uverbs), made by runc as 1:3 like the host's.
	want_devs=$(vf_field "$VF" 'charDevices[]' | xargs -n1 basename | sort | xargs)
	got_devs=$(find "/proc/$PID/root/dev/infiniband" -mindepth 1 -printf '%f\n' 2>/dev/null | sort | xargs)
	expect "container /dev/infiniband of $VF ($rdma)" "$want_devs" "$got_devs"
	local d bad=
	for d in $got_devs; do
		[[ $(stat -c '%F %t:%T' "/proc/$PID/root/dev/infiniband/$d") == "character special file 1:3" ]] || bad+=" $d"
	done
	check "container /dev/infiniband entries are char devices 1:3${bad:+ (not:$bad)}" test -z "$bad"
	check "device-info file for the CNI written for $VF" \
		test -f "$RUN/devinfo/mellanox.com-mlnx_sriov_rdma-$VF-device.json"
}

# in_pod CMD... runs CMD in the pod's network namespace.
in_pod() { nsenter -t "$PID" -n "$@"; }

test_pod_network() {
	if [[ $CNI_MODE != sriov ]]; then
		skip "CNI part, $NO_SRIOV (pod network: reference bridge plugin)"
		check "pod eth0 has an address in $CNI_SUBNET (bridge + host-local)" \
			bash -c "nsenter -t $PID -n ip -4 -br addr show eth0 | grep -q ' 10\.56\.0\.'"
		return 0
	fi
	local name mac got_mac addr
	read -r _ name _ mac < <(awk -v vf="$VF" '$1 == vf' "$RUN/standins.mac")
	VF_NETDEV=$name VF_MAC=$mac
	check "stand-in $name left the host netns" bash -c "! ip link show $name >/dev/null 2>&1"
	# Not /sys/class/net: sysfs shows the netns of whoever mounted it (the host).
	got_mac=$(in_pod ip -br link show eth0 2>/dev/null | awk '{ print $3 }')
	expect "pod eth0 is the stand-in of $VF ($name, by MAC)" "$mac" "$got_mac"
	addr=$(in_pod ip -4 -br addr show eth0 2>/dev/null | awk '{ print $3 }')
	check "pod eth0 has an address in $CNI_SUBNET ($addr)" bash -c "[[ $addr == 10.56.0.* ]]"
	expect "host-local holds the pod's address" "${addr%/*}" \
		"$(find "$CNI_IPAM/$CNI_NET" -name '10.56.0.*' -printf '%f\n' 2>/dev/null | xargs)"
	# This kernel has no RDMA netlink: the plugin must say so and go on.
	check "sriov CNI logged that it left the RDMA device $(vf_field "$VF" rdmaDevice) in place" \
		grep -q 'level=WARN msg="RDMA device not moved.*rdma='"$(vf_field "$VF" rdmaDevice)"' ' "$RUN/logs/sriov-cni.log"
	check "the other $((WANT_VFS - 1)) stand-ins stay on the host" \
		test "$(awk -v vf="$VF" '$1 != vf { print $2 }' "$RUN/standins.mac" | xargs -n1 ip -br link show 2>/dev/null | wc -l)" = $((WANT_VFS - 1))
	in_pod ip -br addr >&2
}

registrations() { metric fastpath_device_plugin_registrations_total "resource=\"$RESOURCE\",result=\"ok\""; }
registered_again() { (($(registrations) > REGS)); }
pod_listed() { [[ -n $(podres list --pod "$POD_NS/$STATIC_POD" --resource "$RESOURCE") ]]; }

# test_kubelet_restart restarts the kubelet while the pod runs: the kubelet
# empties the device-plugins dir on start, our plugin must notice the new
# kubelet.sock and register again, and the pod must keep its VF.
test_kubelet_restart() {
	local pid_before=$PID
	REGS=$(registrations)
	stop kubelet
	start_kubelet " (after restart)"
	# The new kubelet restores the devices from its checkpoint and may list
	# them before the plugin is back; wait for the registration first.
	require "device plugin registered again after the kubelet restart" 60 registered_again
	require "$RESOURCE advertised again after the kubelet restart" 60 advertised
	# The restarted kubelet lists a static pod in PodResources only once its
	# pod manager has read the manifest again: wait for the pod to be listed
	# (bounded), then it must hold the same VF as before.
	wait_for 30 "pod listed in PodResources again" pod_listed || true
	expect "pod keeps its VF across the kubelet restart" "$VF" \
		"$(podres list --pod "$POD_NS/$STATIC_POD" --resource "$RESOURCE" | cut -f4)"
	expect "pod's container survives the kubelet restart (same PID)" "$pid_before" "$(app_pid || true)"
}

ipam_released() { ! ls "$CNI_IPAM/$CNI_NET"/10.56.0.* >/dev/null 2>&1; }
no_pod_tasks() { [[ $(pod_tasks) == 0 ]]; }
pod_gone() { [[ -z $(podres list --pod "$POD_NS/$STATIC_POD") ]]; }
standin_back() { [[ $(cat "/sys/class/net/$VF_NETDEV/address" 2>/dev/null) == "$VF_MAC" ]]; }

test_pod_delete() {
	rm -f "$K/manifests/$POD.yaml"
	require "pod stopped after its manifest was removed" 60 no_pod_tasks
	check "PodResources no longer lists the pod" wait_for 30 "pod gone from PodResources" pod_gone
	check "host-local released the pod's address (CNI DEL ran)" wait_for 30 "address released" ipam_released
	if [[ $CNI_MODE != sriov ]]; then
		skip "CNI DEL part (stand-in back on the host, state dir empty), $NO_SRIOV"
		return 0
	fi
	check "stand-in back on the host as $VF_NETDEV with MAC $VF_MAC" wait_for 30 "stand-in back" standin_back
	check "CNI state dir $CNI_STATE is empty" bash -c "[[ -z \$(ls -A $CNI_STATE 2>/dev/null | grep -v '^deleted-.*\\.json\$') ]]"
	check "all $WANT_VFS stand-ins on the host" \
		test "$(awk '{ print $2 }' "$RUN/standins.mac" | xargs -n1 ip -br link show 2>/dev/null | wc -l)" = "$WANT_VFS"
}

# ----------------------------------------------------------------- cleanup

# cleanup stops what the run started, by the PIDs it recorded, and puts the
# host back as snapshot_host found it. Safe to run twice, and after a run
# that was killed half way.
cleanup() {
	set +e
	# 1. Let the kubelet stop the pod, so that containerd runs CNI DEL.
	if running kubelet && [[ -n $(ls "$K"/manifests/ 2>/dev/null) ]]; then
		rm -f "$K"/manifests/*
		wait_for 60 "kubelet stopped the pod" no_pod_tasks
	fi
	stop rdma-device-plugin
	stop kernel-standin
	stop kubelet
	# 2. Containers, then mounts under $WORK, pod netns and stand-ins (lib.sh).
	stop_containers
	remove_mounts_netns_standins host_mounts_in_work
	# 3. The bridge, and what the kubelet and containerd made outside $WORK.
	ip link del "$FALLBACK_BRIDGE" 2>/dev/null
	find /var/log/containers -maxdepth 1 -lname "$WORK/*" -delete 2>/dev/null
	restore_host_paths_and_kernel
	# preflight made sure a device-plugins dir that was there was empty.
	[[ -d $DP_DIR ]] && find "$DP_DIR" -mindepth 1 -delete
	# 4. Large or special files of the run; logs stay for a look.
	rm -rf "$C/root" "$C/state" "$C/runc" "$HOST"
	set -e
}

# check_restored compares the host with the snapshot taken at the start.
check_restored() {
	local before=$RUN/before p left=
	for p in kubelet rdma-device-plugin kernel-standin containerd; do
		[[ -f $RUN/pids/$p ]] && left+=" $p"
	done
	check "no process of the run left" test -z "$left"
	same "links named as stand-ins or the bridge as before" "$before/links" host_links
	same "pod netns (cni-*) as before" "$before/netns" host_netns
	same "no mounts left under $WORK" /dev/null host_mounts_in_work
	same "cgroups (kubepods) as before" "$before/cgroups" host_cgroups
	same "${HOST_PATHS[*]}: as before" "$before/paths" host_paths
	same "sysctls the kubelet sets are back" "$before/sysctls" host_sysctls
}

# What the PASS/FAIL table is headed with (summary, in lib.sh).
SUMMARY_TITLE="fastpath e2e ($CNI_MODE CNI, kubelet $K8S_VERSION, containerd $CONTAINERD_VERSION)"

main() {
	local t0
	t0=$(date +%s.%N)
	preflight
	"$E2E_DIR/build.sh"
	log "build step: $(elapsed "$t0")s"
	rm -rf "$RUN"
	trap on_exit EXIT
	trap 'exit 130' INT TERM
	snapshot_host
	setup_host
	[[ $CNI_MODE == sriov ]] && setup_standins
	write_cni_conf
	start_containerd
	write_kubelet_config
	start_kubelet
	start_device_plugin
	test_advertised
	start_pod
	test_pod_devices
	test_pod_network
	test_kubelet_restart
	test_pod_delete
	if [[ $CNI_MODE == sriov ]]; then
		test_provision
	else
		skip "provisioning phase, $NO_SRIOV (it checks the pod's VF netdev through the sriov CNI)"
	fi
	log "test steps done in $(elapsed "$t0")s"
}

main "$@"
