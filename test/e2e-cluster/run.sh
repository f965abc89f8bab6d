#!/usr/bin/env bash
# make e2e-cluster: the user's path on a one-node cluster built here from
# upstream sources — etcd, kube-apiserver, controller-manager, scheduler, the
# kubelet registered as a Node, containerd and runc, Multus (thin plugin)
# over the reference bridge, whereabouts — with deployments/ applied as
# shipped through `kubectl apply -k`, the seed's NAD and training pod, and
# deployments/examples/; then the DRA phase (dra.sh) with
# deployments/components/dra, and the provisioning phase (provision.sh)
# with deployments/components/provision. The node is the DGX H100 fixture
# host. Then the two-node phase (twonode.sh): two nodes made of namespaces
# (nodes.sh) on one fabric, a training job across them. See
# test/e2e-cluster/README.md for what it checks and why.
#
# Usage (root): make e2e-cluster   or   test/e2e-cluster/run.sh
# Env: WORK (default $REPO/.e2e-work, shared with make e2e).
#
# Everything it starts is stopped by PID and everything it changes on the
# host is put back on exit, also when a step fails or on Ctrl-C.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$CLUSTER_DIR/cluster.sh"
source "$CLUSTER_DIR/checks.sh"
source "$CLUSTER_DIR/dra.sh"
source "$CLUSTER_DIR/dra-restart.sh"
source "$CLUSTER_DIR/provision.sh"
source "$CLUSTER_DIR/lifecycle.sh"
source "$CLUSTER_DIR/nodes.sh"
source "$CLUSTER_DIR/twonode.sh"
source "$CLUSTER_DIR/scale.sh"

HOST=$RUN/host # copy of the fixture host, with real char devices
FIXTURE=$REPO/testdata/sysfs/dgx-h100
CONFIG=$REPO/testdata/config/combined.json # the shipped ConfigMap's (deployments/manifests_test.go)
RESOURCE=mellanox.com/mlnx_sriov_rdma
SHARED_RESOURCE=rdma/hca_shared_devices_a
WANT_VFS=32
WANT_SHARED=63
SRIOV_STATE=/var/lib/cni/sriov # the sriov CNI's default stateDir (the NADs set none)
DEVINFO_DIR=/var/run/k8s.cni.cncf.io/devinfo/dp
# sysctls the kubelet sets on start; put back on exit.
KUBELET_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
# Host paths the cluster creates outside $WORK (the DaemonSet's hostPaths,
# the kubelet's root, whereabouts' flat file, the CNI state): removed on exit
# when they were not there before.
HOST_PATHS=(/var/lib/kubelet /var/log/containers /var/log/pods /run/containerd /run/netns /usr/libexec/kubernetes
	/opt/cni /etc/cni /run/k8s.cni.cncf.io /var/lib/cni /var/lib/cni/results /var/lib/cni/sriov /var/run/cdi /var/lib/fastpath)
# HOST_FILES are what the run writes into host directories that may have
# been there before it (a workstation with CNI plugins installed): the
# DaemonSet's init container installs sriov, and whereabouts reads its
# kubeconfig's path from the flat file. preflight refuses to start when one
# is there; cleanup removes them, and the directory each is in when the run
# made it, also when the directories above were there before (the
# HOST_PATHS cleanup leaves those alone).
HOST_FILES=(/opt/cni/bin/sriov /opt/cni/bin/sriov.pre-fastpath /etc/cni/net.d/whereabouts.d/whereabouts.conf)
# CDI_SPECS are the names of the CDI specs the run's drivers write into
# $CDI_DIR: the DRA driver's and the stand-in GPU driver's claim specs, the
# device plugin's pool specs (components/cdi). A run stopped before its
# claims are unprepared leaves some, in a $CDI_DIR that may have been there
# before it; cleanup removes the ones that were not there at the start.
CDI_SPECS=("$DRA_DRIVER-*.json" "$GPU_DRIVER-*.json" "fastpath-*.json")

# ---------------------------------------------------------------- preflight

preflight() {
	if ((EUID != 0)); then
		echo "SKIPPED: make e2e-cluster needs root (it runs a cluster, containerd and runc, makes device nodes and links)." >&2
		exit 0
	fi
	local missing=() t
	for t in runc ip nsenter unshare mknod curl jq openssl mountpoint tar sha256sum dpkg-deb apt-get; do
		command -v "$t" >/dev/null || missing+=("$t")
	done
	((${#missing[@]} == 0)) || die "missing tools: ${missing[*]} (Debian: apt-get install runc iproute2 util-linux curl jq openssl coreutils tar dpkg apt)"
	if [[ -d $RUN/pids || -f $RUN/before/links ]]; then
		log "cleaning up after an interrupted previous run"
		cleanup
	fi
	# Refuse a node that is one already: the test owns these.
	[[ ! -S $DP_DIR/kubelet.sock && ! -e $K/pods && ! -e $K/pod-resources ]] ||
		die "$K is in use (a kubelet runs here?): run on a machine without a kubelet"
	[[ ! -e /opt/cni/bin/sriov ]] || die "/opt/cni/bin/sriov exists: the DaemonSet would replace it"
	[[ ! -e /etc/cni/net.d/whereabouts.d ]] || die "/etc/cni/net.d/whereabouts.d exists: whereabouts is configured here"
	local p
	for p in $ETCD_PORT $ETCD_PEER_PORT $API_PORT $KCM_PORT $SCHED_PORT $HEALTHZ_PORT $METRICS_PORT; do
		if (: <"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then die "port $p is in use on 127.0.0.1"; fi
	done
	# The node network and the nodes' netns are the test's own.
	[[ -z $(ip -o addr show to "$NODE_NET" 2>/dev/null) ]] || die "an address in $NODE_NET (the node network) is on this host"
	! ip link show "$NODE_BRIDGE" >/dev/null 2>&1 || die "link $NODE_BRIDGE exists"
	[[ -z $(node_netns) ]] || die "netns $(node_netns | xargs) exist: the two-node phase's nodes"
}

# snapshot_host records what the test may change, so that cleanup puts back
# exactly that and the last check tells whether it did.
snapshot_host() {
	snapshot_common
	iptables_rules >"$RUN/before/iptables"
	cni_cache >"$RUN/before/cni-cache"
	sysctl_get net.ipv4.ip_forward >"$RUN/before/ip_forward"
	host_files >"$RUN/before/files"
	cdi_specs >"$RUN/before/cdi-specs"
	local f
	for f in "${HOST_FILES[@]}"; do
		if [[ -d $(dirname "$f") ]]; then dirname "$f"; fi
	done >"$RUN/before/file-dirs"
}

# host_files prints each of HOST_FILES that is there (none is at the start:
# preflight refuses).
host_files() {
	local f
	for f in "${HOST_FILES[@]}"; do
		[[ -e $f ]] && echo "$f"
	done
	return 0
}

# cdi_specs prints the paths of the specs in $CDI_DIR named as CDI_SPECS.
cdi_specs() {
	local p
	for p in "${CDI_SPECS[@]}"; do
		# None when the directory is missing (find fails; set -e, pipefail).
		find "$CDI_DIR" -maxdepth 1 -name "$p" 2>/dev/null || true
	done | sort
}

host_links() {
	ip -o link show | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' |
		{ grep -E "^(ibp[0-9]+s[0-9]+(v[0-9]+)?|sp[0-9]+s[0-9]+(v[0-9]+)?|$POD_BRIDGE|veth.*|fpn-.*)\$" || true; } | sort
}
host_mounts() { awk -v w="$WORK/" -v k="$K" 'index($5, w) == 1 || $5 == k || index($5, k "/") == 1 { print $5 }' /proc/self/mountinfo | sort; }
# cni_cache lists libcni's result cache, where containerd keeps each
# attachment until its DEL succeeds.
# Nothing when the directory is missing (find fails; set -e, pipefail).
cni_cache() { { find /var/lib/cni/results -mindepth 1 2>/dev/null || true; } | sort; }
# iptables_rules lists the host's rules when iptables is installed.
iptables_rules() {
	if command -v iptables-save >/dev/null; then iptables-save 2>/dev/null | grep -v '^#' | sed 's/\[[0-9:]*\]//'; fi
	return 0
}

# ------------------------------------------------------------------- setup

# setup_host copies the fixture host with real char devices (1:3, as make
# e2e does), and stands in for its netdevs: a veth pair per VF netdev of
# the pool (ibp24s0v0 …, peer sp24s0v0 …) and per PF netdev (ibp24s0 …,
# peer sp24s0 …), whose link state the device plugin follows.
setup_host() {
	mkdir -p "$RUN"
	cp -a "$FIXTURE" "$HOST"
	local f
	for f in "$HOST"/dev/infiniband/*; do
		rm -f "$f"
		mknod -m 0666 "$f" c 1 3
	done
	"$WORK/bin/rdma-device-plugin" discover --host-root "$HOST" --config "$CONFIG" -o json >"$RUN/discover.json"
	check "discover on the fixture copy finds $WANT_VFS VFs in $RESOURCE" \
		test "$(jq --arg r "$RESOURCE" '[.pools[] | select(.resource == $r) | .devices[]] | length' "$RUN/discover.json")" = "$WANT_VFS"

	local vf name peer pf
	: >"$RUN/standins"
	: >"$RUN/pf-standins"
	for vf in $(jq -r --arg r "$RESOURCE" '.pools[] | select(.resource == $r) | .devices[]' "$RUN/discover.json"); do
		name=$(vf_field "$vf" netdev)
		peer=s${name#ib}
		wait_names_free "$name" "$peer"
		echo "$name $peer" >>"$RUN/standins"
		ip link add "$name" type veth peer name "$peer"
		ip link set "$peer" up
		echo "$vf $name $peer $(<"/sys/class/net/$name/address")" >>"$RUN/standins.mac"
		pf=$(vf_field "$(vf_field "$vf" pfAddress)" netdev)
		if ! grep -qx "$pf" "$RUN/pf-standins"; then
			# A veth pair (the kernel may lack dummy): up with its peer up.
			wait_names_free "$pf" "s${pf#ib}"
			echo "$pf" >>"$RUN/pf-standins"
			ip link add "$pf" type veth peer name "s${pf#ib}"
			ip link set "s${pf#ib}" up
			ip link set "$pf" up
		fi
	done
	log "stand-ins: $(wc -l <"$RUN/standins") veth pairs for VFs, $(wc -l <"$RUN/pf-standins") for PFs"
}

vf_field() { jq -r --arg a "$1" ".devices[] | select(.pciAddress == \$a) | .$2" "$RUN/discover.json"; }
names_free() { ! ip link show "$1" >/dev/null 2>&1 && ! ip link show "$2" >/dev/null 2>&1; }
# The CNI's tests briefly make links with these names on a shared machine.
wait_names_free() {
	names_free "$1" "$2" || wait_for 60 "no link named $1 or $2 on the host" names_free "$1" "$2" ||
		die "link $1 or $2 exists on this host; the test would take it over"
}

# ----------------------------------------------------------------- cleanup

# cleanup stops what the run started, by recorded PID, and puts the host
# back as snapshot_host found it. Safe to run twice, and after a run that
# was killed half way.
cleanup() {
	set +e
	# 1. Let the cluster stop the pods, so that containerd runs CNI DEL.
	if running kube-apiserver && nodes_kubelet_running; then
		nodes_delete_pods
	fi
	nodes_cleanup
	if running kube-apiserver && running kubelet; then
		kubectl delete pods --all -n default --wait=false >/dev/null 2>&1
		kubectl delete -k "$RUN/deploy" --wait=false >/dev/null 2>&1
		[[ -d $RUN/deploy-dra ]] && kubectl delete -k "$RUN/deploy-dra" --wait=false >/dev/null 2>&1
		[[ -d $RUN/deploy-provision ]] && kubectl delete -k "$RUN/deploy-provision" --ignore-not-found --wait=false >/dev/null 2>&1
		[[ -d $RUN/deploy-lifecycle ]] && kubectl delete -k "$RUN/deploy-lifecycle" --ignore-not-found --wait=false >/dev/null 2>&1
		wait_for 90 "kubelet stopped the pods" no_pod_tasks
	fi
	local p
	for p in gpu-standin kernel-standin kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$p"; done
	stop_containers
	remove_mounts_netns_standins host_mounts
	local before=$RUN/before name
	if [[ -f $RUN/pf-standins ]]; then
		while read -r name; do ip link del "$name" 2>/dev/null; done <"$RUN/pf-standins"
	fi
	ip link del "$POD_BRIDGE" 2>/dev/null
	find /var/log/containers -maxdepth 1 -lname "$WORK/*" -delete 2>/dev/null
	if [[ -f $before/files ]]; then
		for p in "${HOST_FILES[@]}"; do
			rm -f "$p"
			grep -qxF "$(dirname "$p")" "$before/file-dirs" || rmdir "$(dirname "$p")" 2>/dev/null
		done
	fi
	if [[ -f $before/cdi-specs ]]; then
		for p in $(comm -13 "$before/cdi-specs" <(cdi_specs)); do
			rm -f "$p" && log "removed leftover CDI spec $p"
		done
	fi
	restore_host_paths_and_kernel
	rm -rf "$C/root" "$C/state" "$C/runc" "$HOST" "$RUN/etcd"
	set -e
}

# check_restored compares the host with the snapshot taken at the start.
check_restored() {
	local before=$RUN/before p left=
	for p in gpu-standin kernel-standin kubelet kube-scheduler kube-controller-manager kube-apiserver etcd containerd; do
		[[ -f $RUN/pids/$p ]] && left+=" $p"
	done
	check "no process of the run left" test -z "$left"
	same "links named as stand-ins, the pod bridge or veths as before" "$before/links" host_links
	same "pod netns (cni-*) as before" "$before/netns" host_netns
	same "no netns of the two-node phase (fpn-*) left" /dev/null node_netns
	same "no mounts left under $WORK or $K" /dev/null host_mounts
	same "cgroups (kubepods) as before" "$before/cgroups" host_cgroups
	same "${HOST_PATHS[*]}: as before" "$before/paths" host_paths
	same "${HOST_FILES[*]}: gone, as before" "$before/files" host_files
	same "CDI specs of the run's drivers in $CDI_DIR as before" "$before/cdi-specs" cdi_specs
	same "sysctls the kubelet sets are back" "$before/sysctls" host_sysctls
	same "CNI result cache (/var/lib/cni/results) as before: every DEL succeeded" "$before/cni-cache" cni_cache
	same "iptables rules as before (no masquerade, no kube chains)" "$before/iptables" iptables_rules
	same "net.ipv4.ip_forward as before (no gateway on the pod bridge)" "$before/ip_forward" sysctl_get net.ipv4.ip_forward
}

# What the PASS/FAIL table is headed with (summary, in test/e2e/lib.sh).
SUMMARY_TITLE="fastpath e2e-cluster (Kubernetes $K8S_VERSION, etcd $ETCD_VERSION, containerd $CONTAINERD_VERSION, Multus $MULTUS_VERSION, whereabouts $WHEREABOUTS_VERSION)"

main() {
	local t0
	t0=$(date +%s.%N)
	preflight
	"$CLUSTER_DIR/build.sh"
	log "build step: $(elapsed "$t0")s"
	t0=$(date +%s.%N)
	rm -rf "$RUN"
	mkdir -p "$RUN/logs"
	trap on_exit EXIT
	trap 'exit 130' INT TERM
	snapshot_host
	node_network_up
	if [[ ${E2E_CLUSTER_PHASES:-all} =~ ^(nodes|scale|nodes,scale)$ ]]; then
		# Development: the two-node phase (nodes), the scale phase
		# (scale) or both, without the one-node phases.
		make_pki
		start_etcd
		start_apiserver
		start_controllers
		setup_cni_identities
		if [[ $E2E_CLUSTER_PHASES == nodes* ]]; then test_two_nodes; fi
		if [[ $E2E_CLUSTER_PHASES == *scale ]]; then test_scale; fi
		log "test steps done in $(elapsed "$t0")s"
		return
	fi
	setup_host
	make_pki
	start_etcd
	start_apiserver
	start_controllers
	setup_cni_identities
	write_cni_conf
	start_containerd
	write_kubelet_config
	start_kubelet
	if [[ ${E2E_CLUSTER_PHASES:-all} == lifecycle ]]; then
		# Development: install, upgrade and uninstall alone (lifecycle.sh).
		test_lifecycle
		log "test steps done in $(elapsed "$t0")s"
		return
	fi
	test_deploy
	test_seed_pod
	test_examples
	test_link_down
	test_plugin_restart
	test_kubelet_restart
	test_delete
	test_dra
	test_provision
	test_lifecycle
	test_two_nodes
	test_scale
	log "test steps done in $(elapsed "$t0")s"
}

main "$@"
