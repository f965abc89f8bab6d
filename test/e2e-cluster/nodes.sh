# shellcheck shell=bash
# The two-node phase's nodes (sourced by run.sh): two Kubernetes nodes on
# this one machine, made the way kind makes its nodes, from namespaces
# instead of machines. A node is
#
#   - a network namespace, fpn-<n>: its eth0 (a veth whose host end is on
#     the node network's bridge $NODE_BRIDGE, $NODE_NET) with the node's IP,
#     its lo, its PF and VF stand-ins;
#   - a mount namespace, held by one process (the node's "init", a sleep in
#     $RUN/nodes/<n>/init.pid, started in the node's netns): the node's own
#     /var/lib/kubelet, /etc/cni/net.d, /opt/cni/bin, /var/lib/cni,
#     /run/containerd, /run/netns, /run/k8s.cni.cncf.io, /run/cdi,
#     /var/lib/fastpath and /var/log/{pods,containers} (bind mounts of
#     $RUN/nodes/<n>/root/<path>), a sysfs of its own network namespace on
#     /sys (the host's cgroup mounts moved onto it), and its fixture host on
#     $NODE_HOST — one path, each node's own tree there, so that one
#     DaemonSet spec (hostPath $NODE_HOST/sys, /dev; --node-root) serves
#     both nodes unchanged;
#   - its containerd and kubelet, started inside both namespaces (nsenter),
#     the kubelet's pods under a cgroup root of their own
#     (/fastpath-e2e-<n>), registered with the API server as Node
#     fastpath-e2e-<n>.
#
# Shared, as on a kind host: the kernel, the PID namespace, /proc, the
# cgroup hierarchies, the built binaries and $RUN (paths outside the bind
# mounts), and the control plane, which stays on the host and listens on
# the node network's host address ($API_HOST).
#
# The fabric is a third network namespace, fpn-fabric, with one bridge
# ($FABRIC_BRIDGE): each VF stand-in's far end is a port of it, named
# <n>-<peer> (a-sp24s0v0, b-ens1f0v0), so that a VF in a pod on one node
# reaches a VF in a pod on the other, as two HCAs on one InfiniBand or
# RoCE fabric do.

NODE_NET=10.58.0.0/24
NODE_BRIDGE=fpn-br0
NODE_HOST=$RUN/node-host # where each node has its fixture host (its own tree, one path)
FABRIC_NS=fpn-fabric
FABRIC_BRIDGE=fabric0
# The paths a kubelet, containerd, Multus, whereabouts, the CNI and the
# DaemonSet use on a node, whatever they are told: each node has its own.
NODE_PATHS=(/var/lib/kubelet /etc/cni/net.d /opt/cni/bin /var/lib/cni /run/containerd /run/netns
	/run/k8s.cni.cncf.io /run/cdi /var/lib/fastpath /var/log/pods /var/log/containers)

node_name() { echo "fastpath-e2e-$1"; }
# Nodes a and b are the two-node phase's, s1 … s8 the scale phase's
# (scale.sh): 10.58.0.2, .3, .11 … .18.
node_ip() { case $1 in a) echo 10.58.0.2 ;; b) echo 10.58.0.3 ;; s[0-9]*) echo "10.58.0.$((10 + ${1#s}))" ;; esac; }
node_ns() { echo "fpn-$1"; }
node_dir() { echo "$RUN/nodes/$1"; }
node_init() { cat "$(node_dir "$1")/init.pid" 2>/dev/null; }
# node_exec N CMD... runs CMD in node N's network and mount namespaces.
node_exec() { nsenter -t "$(node_init "$1")" -m -n -- "${@:2}"; }
# node_ctr N ARGS: ctr on node N (in its namespaces: the FIFOs of an exec
# are under the node's /run/containerd).
node_ctr() { node_exec "$1" "$WORK/bin/ctr" --address "$(node_dir "$1")/containerd/containerd.sock" --namespace k8s.io "${@:2}" 2>>"$RUN/logs/ctr-$1.log"; }
node_podres() { "$WORK/bin/podres" --socket "$(node_dir "$1")/root/var/lib/kubelet/pod-resources/kubelet.sock" "${@:2}"; }
# node_path N PATH: where node N's PATH (one of NODE_PATHS, or below) is on the host.
node_path() { echo "$(node_dir "$1")/root$2"; }

# node_network_up makes the node network's bridge with the host's address
# on it, where the API server listens for the nodes (and the host). Called
# before the API server starts; the bridge has no port until the nodes come.
node_network_up() {
	ip link add "$NODE_BRIDGE" type bridge
	ip addr add "$API_HOST/${NODE_NET#*/}" dev "$NODE_BRIDGE"
	ip link set "$NODE_BRIDGE" up
}

# node_up N FIXTURE makes node N: its namespaces and mounts, its fixture
# host with char devices, its CNI configuration, containerd with the
# images, the kubelet; the Node registers and gets Ready.
node_up() {
	local n=$1 fixture=$2 d ns pid p
	d=$(node_dir "$n")
	ns=$(node_ns "$n")
	mkdir -p "$d" "$NODE_HOST"
	echo "$n" >>"$RUN/nodes-made"
	echo "$ns" >>"$RUN/node-netns"
	ip netns add "$ns"
	ip link add "fpn-$n" type veth peer name eth0 netns "$ns"
	ip link set "fpn-$n" master "$NODE_BRIDGE" up
	ip -n "$ns" addr add "$(node_ip "$n")/${NODE_NET#*/}" dev eth0
	ip -n "$ns" link set eth0 up
	ip -n "$ns" link set lo up
	# The node's init: a process in the node's netns and a new mount
	# namespace (unshare execs sleep: the PID is the namespace's holder).
	nsenter --net="/run/netns/$ns" -- unshare --mount --propagation private -- sleep infinity &
	echo $! >"$d/init.pid"
	wait_for 10 "node $n's mount namespace" node_unshared "$n" || die "node $n: no mount namespace"
	pid=$(node_init "$n")
	for p in "${NODE_PATHS[@]}"; do
		mkdir -p "$d/root$p" "$p"
		nsenter -t "$pid" -m -- mount --bind "$d/root$p" "$p"
	done
	# A sysfs of the node's netns on /sys (what `ip netns exec` does), with
	# the cgroup hierarchies kept: the kubelet and runc need them.
	mkdir -p "$d/cgroup"
	nsenter -t "$pid" -m -n -- sh -ec "mount --rbind /sys/fs/cgroup '$d/cgroup'; umount -l /sys
		mount -t sysfs sysfs /sys; mount --move '$d/cgroup' /sys/fs/cgroup"
	# Its fixture host, with the node's char devices as make e2e makes them.
	cp -a "$fixture" "$d/host"
	for p in "$d"/host/dev/infiniband/*; do
		rm -f "$p"
		mknod -m 0666 "$p" c 1 3
	done
	nsenter -t "$pid" -m -- mount --bind "$d/host" "$NODE_HOST"
	# The kubelet's pods go under a cgroup root of the node's own (it must be
	# there before the kubelet starts).
	for p in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
		# Each hierarchy's root (v1: one a controller; v2: /sys/fs/cgroup).
		if [[ -f $p/cgroup.procs ]] && mountpoint -q "$p"; then mkdir -p "$p/fastpath-e2e-$n"; fi
	done
	if [[ -f /sys/fs/cgroup/cpuset/cpuset.cpus ]]; then
		# cgroup v1's cpuset starts empty: the root's CPUs and memory nodes.
		cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/fastpath-e2e-$n/cpuset.cpus"
		cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/fastpath-e2e-$n/cpuset.mems"
	fi
	log "node $n: netns $ns ($(node_ip "$n")), mount namespace of pid $pid, fixture $(basename "$fixture")"
}

# node_unshared N: node N's init is in a mount namespace of its own.
node_unshared() {
	local pid
	pid=$(node_init "$1") && [[ $(readlink "/proc/$pid/ns/mnt") != "$(readlink /proc/self/ns/mnt)" ]]
}

# node_cni N writes node N's CNI configuration into its own /etc/cni/net.d
# and /opt/cni/bin: Multus over the reference bridge (pod subnet
# 10.57.<i>.0/24, its own bridge in the node's netns), whereabouts' flat
# file, the plugins.
node_cni() {
	local n=$1 i=$2 d
	d=$(node_dir "$n")
	mkdir -p "$d/cni/default" "$d/cni/ipam"
	ln -s "$WORK"/cni-plugins/* "$(node_path "$n" /opt/cni/bin)/"
	cat >"$d/cni/default/10-pods.conflist" <<EOF
{"cniVersion":"1.0.0","name":"e2e-pods","plugins":[
  {"type":"bridge","bridge":"$POD_BRIDGE","isGateway":false,"ipMasq":false,
   "ipam":{"type":"host-local","ranges":[[{"subnet":"10.57.$i.0/24"}]],"dataDir":"$d/cni/ipam"}}]}
EOF
	cat >"$(node_path "$n" /etc/cni/net.d)/00-multus.conf" <<EOF
{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus",
 "kubeconfig":"$KCFG/multus.kubeconfig",
 "clusterNetwork":"e2e-pods","confDir":"$d/cni/default","cniDir":"$d/cni/multus","binDir":"/opt/cni/bin",
 "logFile":"$RUN/logs/multus-$n.log","logLevel":"verbose"}
EOF
	mkdir -p "$(node_path "$n" /etc/cni/net.d)/whereabouts.d"
	cat >"$(node_path "$n" /etc/cni/net.d)/whereabouts.d/whereabouts.conf" <<EOF
{"datastore":"kubernetes","kubernetes":{"kubeconfig":"$KCFG/whereabouts.kubeconfig"},
 "log_file":"$RUN/logs/whereabouts-$n.log","log_level":"debug"}
EOF
}

# node_containerd N starts node N's containerd inside the node, its CNI
# directories the node's /opt/cni/bin and /etc/cni/net.d, its plugins
# reading the node's fixture host, and imports the images.
node_containerd() {
	local n=$1 img
	local C CTRD_SOCK HOST=$NODE_HOST CTRD_PROC=containerd-$1
	local NODE_EXEC=(nsenter -t "$(node_init "$n")" -m -n --)
	C=$(node_dir "$n")/containerd
	CTRD_SOCK=$C/containerd.sock
	start_containerd_with /opt/cni/bin /etc/cni/net.d
	for img in "$WORK/image/pause-oci.tar" "$WORK/fastpath-image/fastpath.tar" "$WORK/workload-image/workload.tar"; do
		ctr images import --all-platforms "$img" >/dev/null
	done
	expect "node $n: images in its containerd" 3 "$(ctr images ls -q 'name~=^localhost/fastpath-e2e/' | wc -l)"
}

# node_kubelet N [LABEL] starts node N's kubelet (node_kubelet_start) and
# waits for its /healthz and the Node Ready.
node_kubelet() {
	node_kubelet_start "$1"
	node_kubelet_ready "$@"
}

# node_kubelet_start N starts node N's kubelet inside the node, registered
# as Node fastpath-e2e-N with its IP on the node network; its status
# every NODE_STATUS_FREQUENCY (1s: health reaches allocatable at once).
node_kubelet_start() {
	local n=$1 d name
	d=$(node_dir "$n")
	name=$(node_name "$n")
	if [[ ! -f $d/kubelet/config.yaml ]]; then
		mkdir -p "$d/kubelet" "$d/pod-logs"
		cert "kubelet-$n" "system:node:$name" system:nodes
		kubeconfig "kubelet-$n" "kubelet-$n"
		{
			local CTRD_SOCK=$d/containerd/containerd.sock
			kubelet_config "$d/pod-logs" "$d/volume-plugins"
			cat <<EOF
nodeStatusUpdateFrequency: ${NODE_STATUS_FREQUENCY:-1s}
# The node's pods under a cgroup root of its own, as a kind node's are in
# its container's cgroup.
cgroupRoot: /fastpath-e2e-$n
EOF
		} >"$d/kubelet/config.yaml"
	fi
	shared_root /var/lib/kubelet nsenter -t "$(node_init "$n")" -m --
	start "kubelet-$n" nsenter -t "$(node_init "$n")" -m -n -- "$WORK/bin/kubelet" --config "$d/kubelet/config.yaml" \
		--kubeconfig "$KCFG/kubelet-$n.kubeconfig" --root-dir /var/lib/kubelet --cert-dir "$d/kubelet/pki" \
		--hostname-override "$name" --node-ip "$(node_ip "$n")" --v=2
}

# node_kubelet_ready N [LABEL] [TIMEOUT]: node N's kubelet answers /healthz
# and its Node is Ready (within TIMEOUT s each; default 90 and 120).
node_kubelet_ready() {
	local n=$1 label=${2:-} name
	name=$(node_name "$n")
	require "node $n: kubelet /healthz$label" "${3:-90}" node_exec "$n" curl -sf "http://127.0.0.1:$HEALTHZ_PORT/healthz"
	require "node $name Ready$label" "${3:-120}" kubectl wait --for condition=Ready --timeout 1s "node/$name"
}

# node_kernel_standin N starts kernel-standin in node N (its netns and
# mounts): it plays the kernel for the plugin's sysfs writes on the node's
# fixture host and makes each VF's netdev in the node's netns as the VF is
# probed, recording them in nodes/N/vf-links.
node_kernel_standin() {
	local n=$1
	start "kernel-standin-$n" nsenter -t "$(node_init "$n")" -m -n -- "$WORK/bin/kernel-standin" \
		--host-root "$NODE_HOST" --links-file "$(node_dir "$n")/vf-links"
}
node_kernel_standin_watching() { grep -q 'kernel stand-in watching' "$RUN/logs/kernel-standin-$1.log"; }

# fabric_up makes the fabric: a netns with one bridge.
fabric_up() {
	echo "$FABRIC_NS" >>"$RUN/node-netns"
	ip netns add "$FABRIC_NS"
	ip -n "$FABRIC_NS" link add "$FABRIC_BRIDGE" type bridge
	ip -n "$FABRIC_NS" link set "$FABRIC_BRIDGE" up
}

# node_pf_standins N FILE makes a veth pair in node N's netns for each PF
# netdev listed in FILE ("pf peer" a line), both ends up: the plugin
# follows their link state.
node_pf_standins() {
	local n=$1 pf peer
	while read -r pf peer; do
		ip -n "$(node_ns "$n")" link add "$pf" type veth peer name "$peer"
		ip -n "$(node_ns "$n")" link set "$peer" up
		ip -n "$(node_ns "$n")" link set "$pf" up
	done <"$2"
}

# node_vf_standins N FILE makes each VF netdev listed in FILE ("vf netdev"
# a line) a veth in node N's netns whose peer is the fabric port N-NETDEV.
node_vf_standins() {
	local n=$1 vf name port
	while read -r vf name; do
		port=$n-$name
		ip link add "$name" netns "$(node_ns "$n")" type veth peer name "$port" netns "$FABRIC_NS"
		ip -n "$FABRIC_NS" link set "$port" master "$FABRIC_BRIDGE" up
	done <"$2"
}

# fabric_attach N PEERS...: node N's VF veth peers (made in the node by the
# kernel stand-in) move to the fabric as ports N-PEER.
fabric_attach() {
	local n=$1 p
	shift
	for p in "$@"; do echo "link set $p netns $FABRIC_NS"; done | ip -n "$(node_ns "$n")" -batch -
	for p in "$@"; do
		echo "link set $p name $n-$p"
		echo "link set $n-$p master $FABRIC_BRIDGE up"
	done | ip -n "$FABRIC_NS" -batch -
}

# ------------------------------------------------------------ clean-up

node_netns() { ip netns list 2>/dev/null | awk '$1 ~ /^fpn-/ { print $1 }' | sort; }

# nodes_delete_pods lets the nodes' kubelets stop the pods (CNI DEL runs)
# and the DaemonSet go, within 90 s.
nodes_delete_pods() {
	kubectl delete pods --all -n default --wait=false >/dev/null 2>&1
	[[ -d $RUN/deploy-nodes-base ]] && kubectl delete -k "$RUN/deploy-nodes-base" --wait=false >/dev/null 2>&1
	wait_for 90 "the nodes' kubelets stopped the pods" nodes_no_tasks
}
nodes_no_tasks() {
	local n
	for n in $(nodes_made); do
		running "containerd-$n" || continue
		[[ -z $(node_ctr "$n" tasks ls -q 2>/dev/null) ]] || return 1
	done
}

# nodes_made lists the nodes node_up made in this run (both phases').
nodes_made() { sort -u "$RUN/nodes-made" 2>/dev/null; }
# nodes_kubelet_running: a kubelet of a node runs.
nodes_kubelet_running() {
	local n
	for n in $(nodes_made); do running "kubelet-$n" && return 0; done
	return 1
}

# node_down N... stops what nodes N… run and removes them: the kubelets,
# the containers (runc, by each node's state), containerd and its shims,
# the kernel stand-ins, the init processes (their mount namespaces go with
# them, and the pods' netns bind-mounted there), the netns, the nodes'
# cgroup roots. Their Nodes stay in the API server.
node_down() {
	# Best effort, as cleanup is, also when called from a phase under set -e
	# (wait returns the killed init's 137).
	local - n d pid id rroot
	set +e
	for n in "$@"; do stop "kubelet-$n"; done
	for n in "$@"; do
		stop "kernel-standin-$n"
		d=$(node_dir "$n")
		[[ -d $d ]] || continue
		rroot=$d/containerd/runc/k8s.io
		if [[ -d $rroot ]]; then
			for id in $(runc --root "$rroot" list -q 2>/dev/null); do
				runc --root "$rroot" kill "$id" KILL 2>/dev/null
				runc --root "$rroot" delete --force "$id" 2>/dev/null
			done
		fi
		stop "containerd-$n"
	done
	for pid in /proc/[0-9]*; do
		# A shim of these nodes' containerd: its -address is the node's.
		[[ $(readlink "$pid/exe" 2>/dev/null) == "$WORK/bin/containerd-shim-runc-v2" ]] || continue
		for n in "$@"; do
			if tr '\0' ' ' <"$pid/cmdline" 2>/dev/null | grep -qF "$(node_dir "$n")/containerd/"; then
				kill -KILL "${pid#/proc/}" 2>/dev/null && log "killed leftover shim ${pid#/proc/}"
			fi
		done
	done
	for n in "$@"; do
		d=$(node_dir "$n")
		pid=$(node_init "$n")
		# Only our init: a sleep in a mount namespace other than ours.
		if [[ -n $pid && $(readlink "/proc/$pid/exe" 2>/dev/null) == */sleep ]] && node_unshared "$n"; then
			kill -KILL "$pid" 2>/dev/null
			wait "$pid" 2>/dev/null
			log "stopped node $n's init (pid $pid)"
		fi
		rm -f "$d/init.pid"
		for pid in /sys/fs/cgroup/*/fastpath-e2e-"$n" /sys/fs/cgroup/fastpath-e2e-"$n"; do
			[[ -d $pid ]] && find "$pid" -depth -type d -exec rmdir {} + 2>/dev/null
		done
		ip link del "fpn-$n" 2>/dev/null
		ip netns delete "$(node_ns "$n")" 2>/dev/null
	done
	return 0
}

# nodes_cleanup takes down every node made (node_down), kills any shim
# left, deletes the netns (the fabric's too) and the node network.
nodes_cleanup() {
	local n pid
	# shellcheck disable=SC2046 # node names are single words
	node_down $(nodes_made)
	for pid in /proc/[0-9]*; do
		if [[ $(readlink "$pid/exe" 2>/dev/null) == "$WORK/bin/containerd-shim-runc-v2" ]]; then
			kill -KILL "${pid#/proc/}" 2>/dev/null && log "killed leftover shim ${pid#/proc/}"
		fi
	done
	if [[ -f $RUN/node-netns ]]; then
		while read -r n; do ip netns delete "$n" 2>/dev/null; done <"$RUN/node-netns"
		rm -f "$RUN/node-netns"
	fi
	ip link del "$NODE_BRIDGE" 2>/dev/null
	return 0
}
