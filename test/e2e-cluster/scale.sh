# shellcheck shell=bash
# The scale phase of make e2e-cluster (sourced by run.sh), after the
# two-node phase (whose nodes it takes down): the seed's job at its size.
# Eight DGX-like nodes made as nodes.sh makes nodes (s1 … s8), each the
# fixture dgx-h100-novfs whose VFs the shipped provisioning policy creates
# (8 on each of 8 rails, 64 a node) through the kernel stand-in, their far
# ends on one fabric, and `nvidia.com/gpu: 8` advertised on each Node as
# an extended resource (a PATCH of the Node's status capacity, as the
# Kubernetes docs' "Advertise Extended Resources for a Node" does: no GPU
# plugin). Then:
#
#   - the job: the seed's training pod × 64 in one create (one GPU each,
#     so 8 a node), all Running, distinct VFs and addresses, traffic
#     between pods on different nodes; then one pod a node with 8 GPUs and
#     8 VFs on 8 networks;
#   - figures: makespan and per-pod p50/p99 of the 64 with the VF and the
#     NAD and without them (docs/benchmarks.md);
#   - churn: E2E_SCALE_CYCLES cycles of create 64 → all Running → delete
#     all, with what is left, allocatable, the plugins' RSS and fds;
#   - faults during a burst: a plugin pod deleted, a kubelet restarted, pods
#     deleted while ContainerCreating.
#
# E2E_CLUSTER_PHASES=scale runs it alone; make e2e-cluster-scale runs it
# with 20 churn cycles. See test/e2e-cluster/README.md.

SC_N=${E2E_SCALE_NODES:-8}
# The steps to run (development: a subset; make e2e-cluster-scale runs
# all): the job with and without VFs (job), the 8-GPU pods (8gpu), churn,
# faults.
SC_STEPS=${E2E_SCALE_STEPS:-job,8gpu,churn,faults}
# make e2e-cluster (and CI) leaves the faults out: they can fail for the
# VF stand-in's sake (a veth dies with the sandbox netns containerd
# deletes, where a real VF's netdev goes home; docs/benchmarks.md); make
# e2e-cluster-scale runs them.
[[ -n ${E2E_SCALE_STEPS:-} || ${E2E_CLUSTER_PHASES:-all} != all ]] || SC_STEPS=job,8gpu,churn
SC_CYCLES=${E2E_SCALE_CYCLES:-2}
SC_NODES=()
for ((i = 1; i <= SC_N; i++)); do SC_NODES+=("s$i"); done
SC_GPUS=8                        # a DGX's GPUs, advertised on each Node
SC_VFS=$((TN_RAILS * TN_NUMVFS)) # what the shipped policy makes on a node
SC_PODS=$((SC_N * SC_GPUS))      # the job: one GPU and one VF a pod
GPU=nvidia.com/gpu
SC_LABEL=fastpath-e2e/scale
# Bounds (s), on 2 shared cores: all SC_PODS pods Running after their
# create; gone after their delete; a node's pods' leftovers cleaned up.
SC_RUNNING_BOUND=${E2E_SCALE_RUNNING_BOUND:-420}
SC_GONE_BOUND=180
SC_BUSYBOX=$WORK/debs/busybox-static/bin/busybox
# The kubelets' node status every 10 s (the kubelet's default) rather than
# the other phases' 1 s: eight nodes' updates each second load the API
# server that Multus gives 250 ms a request.
SC_STATUS_FREQUENCY=10s
# The 8-GPU pod's networks: one NAD a rail, each its own whereabouts range.
SC_RAIL_NADS=()
for ((i = 0; i < TN_RAILS; i++)); do SC_RAIL_NADS+=("sriov-rail-$i"); done

# ------------------------------------------------------------ the phase

test_scale() {
	phase "scale: $SC_N DGX-like nodes, $SC_VFS VFs each from the shipped policy, the seed's job × $SC_PODS; steps $SC_STEPS (churn: $SC_CYCLES cycles)"
	local t0
	t0=$(date +%s.%N)
	SC_DIR=$RUN/scale
	mkdir -p "$SC_DIR"
	sc_nodes_up
	sc_deploy
	log "scale phase: $SC_N nodes up and deployed in $(elapsed "$t0")s"
	kubectl apply -f "$CLUSTER_DIR/seed/sriov-net-ib.yaml" >/dev/null
	sc_seed_pod_json >"$SC_DIR/seed.json"
	if sc_step job; then
		sc_job
		sc_bench_report
	fi
	if sc_step 8gpu; then sc_8gpu; fi
	if sc_step churn; then sc_churn; fi
	if sc_step faults; then sc_faults; fi
	sc_nothing_left
	log "scale phase done in $(elapsed "$t0")s"
}

sc_step() { [[ ,$SC_STEPS, == *,"$1",* ]]; }

# ------------------------------------------------------------ nodes

# sc_nodes_up takes down the two-node phase's nodes (when it ran) and
# brings up SC_NODES on the fabric: each dgx-h100-novfs with the 8 rails'
# PF stand-ins, its CNI, containerd and kubelet (all started, then waited
# for), its kernel stand-in; labelled as the shipped policy selects, with
# SC_GPUS GPUs advertised.
sc_nodes_up() {
	local n k
	for n in $(nodes_made); do
		node_down "$n"
		kubectl delete node "$(node_name "$n")" --ignore-not-found --wait=true --timeout 60s >/dev/null
		log "the two-node phase's node $n taken down, its Node deleted"
	done
	node_netns | grep -qx "$FABRIC_NS" || fabric_up
	# The kernel tears a deleted netns down later, from a workqueue: the
	# two-node phase's fabric ports (their peers in its nodes' netns) can
	# outlive `ip netns delete` by seconds on a loaded machine (CI counted
	# 8 of them once). They are deleted here, and none may be left.
	sc_fabric_foreign | while read -r k; do ip -n "$FABRIC_NS" link del "$k" 2>/dev/null; done
	require "fabric: no port of the two-node phase's nodes left" 30 sc_fabric_clean
	grep -o '"ibp[0-9]*s0"' "$REPO/deployments/components/provision/policies.yaml" | tr -d '"' |
		awk '{ p = $1; sub(/^ib/, "", p); print $1, "s" p }' >"$SC_DIR/pf-standins"
	for n in "${SC_NODES[@]}"; do
		k=${n#s}
		node_up "$n" "$TN_FIXTURE_A"
		node_pf_standins "$n" "$SC_DIR/pf-standins"
		node_cni "$n" $((10 + k))
		node_containerd "$n"
		NODE_STATUS_FREQUENCY=$SC_STATUS_FREQUENCY node_kubelet_start "$n"
	done
	for n in "${SC_NODES[@]}"; do node_kubelet_ready "$n" "" 180; done
	for n in "${SC_NODES[@]}"; do node_kernel_standin "$n"; done
	for n in "${SC_NODES[@]}"; do
		require "node $n: kernel stand-in watches its host's sysfs" 60 node_kernel_standin_watching "$n"
		kubectl label node "$(node_name "$n")" "$NFD_LABEL=true" "$TN_POLICY_LABEL=true" >/dev/null
		sc_advertise_gpus "$n"
	done
	for n in "${SC_NODES[@]}"; do
		require "node $n: allocatable $GPU = $SC_GPUS (capacity PATCHed on the Node's status)" 30 sc_gpus_is "$n" "$SC_GPUS"
	done
}

# sc_fabric_foreign prints the fabric's ports that are not the scale
# nodes' (every port is named NODE-PEER by fabric_attach or
# node_vf_standins).
sc_fabric_foreign() {
	ip -n "$FABRIC_NS" -o link show master "$FABRIC_BRIDGE" | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' |
		grep -Ev "^($(IFS='|'; echo "${SC_NODES[*]}"))-" || true
}
sc_fabric_clean() { [[ -z $(sc_fabric_foreign) ]]; }

# sc_advertise_gpus N advertises SC_GPUS GPUs on node N as the Kubernetes
# docs' "Advertise Extended Resources for a Node" does: a JSON-Patch of
# the Node's status capacity; the kubelet then puts them into allocatable.
sc_advertise_gpus() {
	curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" -X PATCH \
		-H 'Content-Type: application/json-patch+json' \
		--data "[{\"op\": \"add\", \"path\": \"/status/capacity/${GPU/\//~1}\", \"value\": \"$SC_GPUS\"}]" \
		"$API/api/v1/nodes/$(node_name "$1")/status" >/dev/null
}
sc_gpus() { kubectl get node "$(node_name "$1")" -o json | jq -r --arg r "$GPU" '.status.allocatable[$r] // "0"'; }
sc_gpus_is() { [[ $(sc_gpus "$1") == "$2" ]]; }

# sc_deploy applies the nodes' overlay (tn_overlay: deployments/ as
# shipped with components/provision) to the SC_N nodes; on each the
# policy makes SC_VFS VFs through the kernel stand-in, whose far ends then
# go onto the fabric.
sc_deploy() {
	local n peers ok=0 numvfs=0 want
	tn_overlay
	check "one DaemonSet spec for the $SC_N nodes: components/provision with its shipped policy, host root $NODE_HOST" \
		tn_rendered "$RUN/deploy-nodes.yaml"
	check "kubectl apply -k of the overlay ($SC_N nodes)" kubectl apply -k "$RUN/deploy-nodes-base"
	require "DaemonSet $DS_NS/$DS Ready on the $SC_N nodes" 420 tn_ds_ready "$SC_N"
	want=$(printf "$TN_NUMVFS %.0s" $(seq "$TN_RAILS"))
	for n in "${SC_NODES[@]}"; do
		require "node $n: the policy's $SC_VFS VFs made and served (allocatable $RESOURCE)" 300 tn_alloc_is "$n" "$SC_VFS"
		[[ $(tn_numvfs "$(node_dir "$n")/host" | awk '$2 != 0 { printf "%s ", $2 }') == "$want" ]] && numvfs=$((numvfs + 1))
		tn_discover "$n"
		mapfile -t peers < <(awk '{ print $2 }' "$(node_dir "$n")/vf-links")
		((${#peers[@]} == SC_VFS)) && ok=$((ok + 1))
		fabric_attach "$n" "${peers[@]}"
		tn_links "$n" >"$(node_dir "$n")/vf-macs"
	done
	expect "nodes whose plugin wrote sriov_numvfs $TN_NUMVFS on each of the $TN_RAILS rails" "$SC_N" "$numvfs"
	expect "nodes on which the kernel stand-in made a veth for each of the $SC_VFS VFs" "$SC_N" "$ok"
	expect "fabric: one bridge, the far ends of the $SC_N nodes' VFs its ports" $((SC_N * SC_VFS)) \
		"$(ip -n "$FABRIC_NS" -o link show master "$FABRIC_BRIDGE" | wc -l)"
}

# ------------------------------------------------------------ pods

# sc_seed_pod_json prints the seed's training pod (seed/training-pod.yaml)
# as JSON, as it is.
sc_seed_pod_json() { kubectl create --dry-run=client -o json -f "$CLUSTER_DIR/seed/training-pod.yaml"; }

# sc_job_list KIND PREFIX prints a List of SC_PODS copies of the seed's
# pod named PREFIX-0 …, labelled $SC_LABEL=PREFIX, with the workload image
# and one GPU each (the seed's job: 1 GPU, 1 VF a pod); KIND novf takes
# out the VF and the NAD (the same pods without them).
sc_job_list() {
	jq --arg kind "$1" --arg prefix "$2" --argjson n "$SC_PODS" --arg img "$WORKLOAD_IMAGE" --arg gpu "$GPU" \
		--arg res "$RESOURCE" --arg lab "$SC_LABEL" '
		del(.status) as $p | {apiVersion: "v1", kind: "List", items: [range($n) as $i | $p
			| .metadata.name = "\($prefix)-\($i)" | .metadata.labels[$lab] = $prefix
			| .spec.containers[0].image = $img
			| .spec.containers[0].resources.requests[$gpu] = "1" | .spec.containers[0].resources.limits[$gpu] = "1"
			| if $kind == "novf" then del(.metadata.annotations["k8s.v1.cni.cncf.io/networks"])
				| del(.spec.containers[0].resources.requests[$res], .spec.containers[0].resources.limits[$res])
			  else . end]}' "$SC_DIR/seed.json"
}

sc_pods_json() { kubectl get pods -l "$SC_LABEL=$1" -o json; }
# sc_phases PREFIX prints "pending running other" counts of PREFIX's pods.
sc_phases() {
	sc_pods_json "$1" | jq -r '[.items[].status.phase] | "\(map(select(. == "Pending")) | length) \(map(select(. == "Running")) | length) \(map(select(. != "Pending" and . != "Running")) | length)"'
}

# sc_create KIND PREFIX creates the SC_PODS pods in one create and waits
# (SC_RUNNING_BOUND, polled every 2 s) until all run. It returns 1 when
# some did not.
sc_create() {
	local kind=$1 prefix=$2 t0 deadline ph
	sc_job_list "$kind" "$prefix" >"$SC_DIR/$prefix.json"
	t0=$(date +%s.%N)
	deadline=$(($(date +%s) + SC_RUNNING_BOUND))
	kubectl create -f "$SC_DIR/$prefix.json" >/dev/null
	while true; do
		ph=$(sc_phases "$prefix")
		if [[ $ph == "0 $SC_PODS 0" ]]; then
			log "ok: $SC_PODS pods $prefix-* ($kind) Running in $(elapsed "$t0")s (wall clock, from before the create)"
			return 0
		fi
		if (($(date +%s) >= deadline)); then
			log "timeout after ${SC_RUNNING_BOUND}s: $prefix-* ($kind): pending, running, other: $ph"
			return 1
		fi
		sleep 2
	done
}

# sc_times PREFIX prints each pod's "name node created scheduled
# sandbox running", epoch seconds: its creationTimestamp and its
# conditions' lastTransitionTime (PodScheduled, PodReadyToStartContainers
# — the sandbox and its networks are up — and Ready: the container runs).
sc_times() {
	sc_pods_json "$1" | jq -r '
		def ts($t): [.status.conditions[]? | select(.type == $t and .status == "True") | .lastTransitionTime | fromdate][0] // -1;
		.items[] | [.metadata.name, .spec.nodeName, (.metadata.creationTimestamp | fromdate),
			ts("PodScheduled"), ts("PodReadyToStartContainers"), ts("Ready")] | @tsv'
}

# sc_stats FILE prints "makespan p50 p99 sched sandbox start n" of a
# sc_times file: first create to last Running, the per-pod create ->
# Running percentiles (nearest rank), and the mean of create -> scheduled,
# scheduled -> sandbox up (device allocation, Multus, the CNI's ADD,
# IPAM), sandbox up -> Running.
sc_stats() {
	local pct
	pct=$(awk '$6 > 0 { print $6 - $3 }' "$1" | sort -n | awk '{ d[NR] = $1 } END { if (NR) print d[int((NR * 50 + 99) / 100)], d[int((NR * 99 + 99) / 100)] }')
	awk -v pct="${pct:-0 0}" '$6 > 0 { n++; if (!c0 || $3 < c0) c0 = $3; if ($6 > r1) r1 = $6
			s1 += $4 - $3; s2 += $5 - $4; s3 += $6 - $5 }
		END { if (!n) { print "0 0 0 0 0 0 0"; exit }
			printf "%d %s %.1f %.1f %.1f %d\n", r1 - c0, pct, s1 / n, s2 / n, s3 / n, n }' "$1"
}

# sc_problems PROBLEM... prints the first five, and how many in all.
sc_problems() {
	(($#)) || return 0
	printf '%s; ' "${@:1:5}"
	(($# <= 5)) || printf '… (%d in all)' "$#"
}
sc_each() { printf "$1 %.0s" $(seq "$2") | xargs; }

# sc_pod_pid N UID prints the PID of the pod's `sleep` (its container's
# process: the seed's command) from the pod's cgroup under node N's root.
sc_pod_pid() {
	local f p
	for f in /sys/fs/cgroup/memory/fastpath-e2e-"$1"/kubepods*/pod"$2"/*/cgroup.procs \
		/sys/fs/cgroup/memory/fastpath-e2e-"$1"/kubepods*/*/pod"$2"/*/cgroup.procs \
		/sys/fs/cgroup/fastpath-e2e-"$1"/kubepods*/pod"$2"/*/cgroup.procs \
		/sys/fs/cgroup/fastpath-e2e-"$1"/kubepods*/*/pod"$2"/*/cgroup.procs; do
		[[ -f $f ]] || continue
		while read -r p; do
			if [[ $(cat "/proc/$p/comm" 2>/dev/null) == sleep ]]; then
				echo "$p"
				return 0
			fi
		done <"$f"
	done
	return 1
}

# sc_assignments PREFIX prints "node pod vf" for every VF of PREFIX's pods
# in the nodes' PodResources.
sc_assignments() {
	local n
	for n in "${SC_NODES[@]}"; do
		node_podres "$n" list --resource "$RESOURCE" | awk -F'\t' -v n="$n" -v p="default/$1-" 'index($1, p) == 1 { sub(/^default\//, "", $1); print n, $1, $4 }'
	done
}

# ------------------------------------------------------------ the job

# sc_job: the seed's pod × SC_PODS, with the VF and the NAD, in one create.
sc_job() {
	local prefix=job
	check "$SC_PODS seed pods (1 GPU, 1 VF, the seed's NAD) created at once: all Running within ${SC_RUNNING_BOUND}s" \
		sc_create vf "$prefix"
	sc_times "$prefix" >"$SC_DIR/times-vf"
	sc_check_job "$prefix"
	sc_traffic "$prefix"
	sc_delete "$prefix"
	sc_check_left "the job deleted" "$prefix"
	check "the same $SC_PODS pods without the VF and the NAD: all Running within ${SC_RUNNING_BOUND}s" \
		sc_create novf bench
	sc_times bench >"$SC_DIR/times-novf"
	expect "without the VF: $SC_GPUS pods on each node" "$(sc_each "$SC_GPUS" "$SC_N")" "$(sc_per_node bench)"
	sc_delete bench
	sc_failures job >"$SC_DIR/failures-vf"
	sc_failures bench >"$SC_DIR/failures-novf"
	sc_lease_wait job >"$SC_DIR/lease-vf" || true
}

sc_per_node() { sc_pods_json "$1" | jq -r '[.items[].spec.nodeName] | group_by(.) | map(length) | join(" ")' | xargs; }

# sc_check_job PREFIX: SC_GPUS pods a node; each pod one VF of its node's
# pool, no VF twice; each address distinct and of the range; network-status,
# the container's net1 (by MAC, with that address), its env.
sc_check_job() {
	local prefix=$1 n pod uid vf mac ip pci pid rdma bad=() status
	sc_pods_json "$prefix" >"$SC_DIR/$prefix-pods.json"
	expect "$SC_GPUS of the job's pods on each node (one GPU each, $SC_GPUS a node)" \
		"$(sc_each "$SC_GPUS" "$SC_N")" "$(sc_per_node "$prefix")"
	sc_assignments "$prefix" | sort >"$SC_DIR/$prefix-vfs"
	expect "PodResources: one VF for each pod, on its own node" "$SC_PODS $SC_PODS" \
		"$(wc -l <"$SC_DIR/$prefix-vfs") $(awk '{ print $2 }' "$SC_DIR/$prefix-vfs" | sort -u | wc -l)"
	expect "no VF given to two pods (distinct node, VF pairs)" "$SC_PODS" "$(awk '{ print $1, $3 }' "$SC_DIR/$prefix-vfs" | sort -u | wc -l)"
	jq -r '.items[] | (.metadata.annotations["k8s.v1.cni.cncf.io/network-status"] // "[]" | fromjson
		| map(select(.interface == "net1"))[0] // {}) as $s
		| [.metadata.name, .metadata.uid, .spec.nodeName, ($s.ips[0] // "-"), ($s.mac // "-"), ($s["device-info"].pci["pci-address"] // "-")] | @tsv' \
		"$SC_DIR/$prefix-pods.json" >"$SC_DIR/$prefix-status"
	expect "distinct whereabouts addresses of $TN_RANGE, one a pod" "$SC_PODS" \
		"$(awk '$4 ~ /^192\.168\.2\.[0-9]+$/ { print $4 }' "$SC_DIR/$prefix-status" | sort -u | wc -l)"
	expect "whereabouts IPPool $TN_RANGE holds the $SC_PODS pods" "$SC_PODS" "$(ippool_pods "$TN_RANGE" | grep -c "^default/$prefix-")"
	: >"$SC_DIR/$prefix-pids"
	while IFS=$'\t' read -r pod uid n ip mac pci; do
		n=${n#fastpath-e2e-}
		vf=$(awk -v p="$pod" '$2 == p { print $3 }' "$SC_DIR/$prefix-vfs")
		[[ $pci == "$vf" ]] || bad+=("$pod: network-status device-info $pci, PodResources $vf")
		[[ $mac == "$(awk -v vf="$vf" '$1 == vf { print $3 }' "$(node_dir "$n")/vf-macs")" ]] || bad+=("$pod: network-status MAC $mac is not $vf's")
		if ! pid=$(sc_pod_pid "$n" "$uid"); then
			bad+=("$pod: no container process")
			continue
		fi
		echo "$pod $n $pid" >>"$SC_DIR/$prefix-pids"
		[[ $(nsenter -t "$pid" -n ip -br link show net1 2>/dev/null | awk '{ print $3 }') == "$mac" ]] || bad+=("$pod: net1 is not $vf's stand-in")
		[[ $(nsenter -t "$pid" -n ip -4 -br addr show net1 2>/dev/null | awk '{ print $3 }') == "$ip/24" ]] || bad+=("$pod: net1 has not $ip")
		rdma=$(tn_vf_field "$n" "$vf" rdmaDevice)
		[[ $(pod_env "$pid" UCX_NET_DEVICES) == "$rdma:1" ]] || bad+=("$pod: UCX_NET_DEVICES $(pod_env "$pid" UCX_NET_DEVICES), not $rdma:1")
		[[ $(pod_env "$pid" NCCL_IB_HCA) == mlx5_0 ]] || bad+=("$pod: NCCL_IB_HCA $(pod_env "$pid" NCCL_IB_HCA), not the seed spec's mlx5_0")
		[[ $(pod_env "$pid" PCIDEVICE_MELLANOX_COM_MLNX_SRIOV_RDMA) == "$vf" ]] || bad+=("$pod: PCIDEVICE_… not $vf")
	done <"$SC_DIR/$prefix-status"
	expect "each pod: network-status net1 has its VF (device-info, MAC), the container's net1 is that VF with that address, UCX_NET_DEVICES and PCIDEVICE_… name its VF's RDMA device and PCI address, NCCL_IB_HCA is the seed spec's mlx5_0 (issue 12: the kubelet keeps the pod's own value)" \
		"" "$(sc_problems "${bad[@]}")"
}

# sc_traffic PREFIX: a pod on each node pings, over net1, a pod on the
# next node (the last node's, the first's): traffic between pods on
# different nodes over their VFs, through the fabric.
sc_traffic() {
	local prefix=$1 i n m from to ok=0 pairs=()
	for ((i = 0; i < SC_N; i++)); do
		n=${SC_NODES[i]} m=${SC_NODES[(i + 1) % SC_N]}
		from=$(awk -v n="$n" '$2 == n { print $3; exit }' "$SC_DIR/$prefix-pids")
		to=$(awk -F'\t' -v n="$(node_name "$m")" '$3 == n { print $4; exit }' "$SC_DIR/$prefix-status")
		if [[ -n $from && -n $to ]] && nsenter -t "$from" -n "$SC_BUSYBOX" ping -c 2 -W 2 -I net1 "$to" >/dev/null 2>&1; then
			ok=$((ok + 1))
		else
			pairs+=("$n->$m")
		fi
	done
	expect "ping over net1 from a pod on each node to a pod on the next node (${SC_N} pairs through the fabric)${pairs:+: failed ${pairs[*]}}" \
		"$SC_N" "$ok"
}

# sc_delete PREFIX deletes PREFIX's pods (grace period 1 s: the seed's
# sleep ignores SIGTERM) and waits until they are gone.
sc_delete() {
	kubectl delete pods -l "$SC_LABEL=$1" --grace-period=1 --wait=false >/dev/null
	check "$1-*: every pod gone within ${SC_GONE_BOUND}s of its delete" wait_for "$SC_GONE_BOUND" "$1-* gone" sc_gone "$1"
}
sc_gone() { [[ -z $(kubectl get pods -l "$SC_LABEL=$1" -o name) ]]; }

# sc_left prints what the pods left: per node, a VF stand-in not home
# under its name and MAC, allocatable other than SC_VFS VFs and SC_GPUS
# GPUs, tn_node_left's (pod netns, the sriov CNI's state and pins,
# libcni's and Multus' caches, PodResources, containers).
sc_left() {
	local n
	for n in "${SC_NODES[@]}"; do
		tn_vfs_home "$n" || echo "$n: $(diff <(tn_links "$n") "$(node_dir "$n")/vf-macs" | grep -c '^>') VFs not home"
		tn_alloc_is "$n" "$SC_VFS" || echo "$n: allocatable $RESOURCE $(tn_alloc "$n")"
		sc_gpus_is "$n" "$SC_GPUS" || echo "$n: allocatable $GPU $(sc_gpus "$n")"
		tn_node_left "$n" | sed "s|^|$n: |"
	done
}
sc_nothing_left_now() { [[ -z $(sc_left) ]]; }

# sc_check_left WHEN [PREFIX]: nothing left (waited for, 120 s: the
# kubelets remove a deleted pod's netns, and the plugins' health reaches
# allocatable, asynchronously; one look at the 8 nodes takes 10-25 s
# under load); PREFIX's addresses whereabouts did not release
# (sc_ippool_release) are logged and released.
sc_check_left() {
	wait_for 120 "nothing left after $1" sc_nothing_left_now || true
	expect "after $1: every VF home on its node, allocatable $SC_VFS VFs and $SC_GPUS GPUs on each, no pod netns, CNI state, pin, cache, PodResources entry or container left" \
		"" "$(sc_left | head -n 5 | paste -sd';')"
	if [[ -n ${2:-} ]]; then
		SC_LEAKED=$(sc_ippool_release "$2")
		log "after $1: $SC_LEAKED addresses of $TN_RANGE still allocated to deleted pods (whereabouts' DEL), released"
	fi
}

# sc_ippool_release PREFIX prints how many addresses of $TN_RANGE are
# still allocated to PREFIX's pods, all deleted, and releases them as
# whereabouts' reconciler (ip-control-loop, which its DaemonSet runs and
# this cluster does not) would. whereabouts v0.9.2's DEL returns success
# when it could not release (cmdDel in cmd/whereabouts.go drops
# IPManagement's error), as when its leader election for the pool times
# out while the API server is slow: the CNI cannot tell.
sc_ippool_release() {
	local pool n
	n=$(ippool_pods "$TN_RANGE" | grep -c "^default/$1-" || true)
	if ((n)); then
		pool=$(kubectl get ippools.whereabouts.cni.cncf.io -A -o json | jq -r --arg r "$TN_RANGE" '.items[] | select(.spec.range == $r) | "\(.metadata.namespace) \(.metadata.name)"')
		kubectl -n "${pool% *}" get ippools.whereabouts.cni.cncf.io "${pool#* }" -o json |
			jq --arg p "default/$1-" '.spec.allocations |= with_entries(select(.value.podref | startswith($p) | not))' |
			kubectl replace -f - >/dev/null
		kubectl get overlappingrangeipreservations.whereabouts.cni.cncf.io -A -o json |
			jq -r --arg p "default/$1-" '.items[] | select(.spec.podref | startswith($p)) | "\(.metadata.namespace) \(.metadata.name)"' |
			while read -r ns name; do kubectl -n "$ns" delete overlappingrangeipreservations.whereabouts.cni.cncf.io "$name" >/dev/null; done
	fi
	echo "$n"
}

# ------------------------------------------------------------ figures

sc_bench_report() {
	local vf novf ratio
	read -r -a vf < <(sc_stats "$SC_DIR/times-vf")
	read -r -a novf < <(sc_stats "$SC_DIR/times-novf")
	ratio=$(awk -v a="${vf[0]}" -v b="${novf[0]}" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
	{
		echo "the seed's job, $SC_PODS pods on $SC_N nodes in one create ($(date -u +%FT%TZ), $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)); seconds, from the pods' timestamps:"
		printf '  %-18s %6s %6s %6s %8s %8s %8s %5s\n' "" makespan p50 p99 "->sched" "->sandbox" "->running" pods
		printf '  %-18s %6s %6s %6s %8s %8s %8s %5s\n' "with VF and NAD" "${vf[@]}"
		printf '  %-18s %6s %6s %6s %8s %8s %8s %5s\n' "without" "${novf[@]}"
		echo "  makespan ratio with/without: $ratio (goal <= 1.10)"
	} | tee "$SC_DIR/figures.txt" >&2
	expect "figures: makespan, p50, p99 of $SC_PODS pods with the VF ($(sed -n 3p "$SC_DIR/figures.txt" | xargs)) and without ($(sed -n 4p "$SC_DIR/figures.txt" | xargs)), ratio $ratio" \
		"$SC_PODS $SC_PODS" "${vf[6]} ${novf[6]}"
	sc_where_time_goes | tee -a "$SC_DIR/figures.txt" >&2
}

# sc_where_time_goes prints what the phases are and how many sandboxes
# failed, by cause (sc_failures).
sc_where_time_goes() {
	echo "  ->sched: create to PodScheduled; ->sandbox: to PodReadyToStartContainers (device allocation, Multus, the CNI's ADD, whereabouts); ->running: to Ready"
	echo "  failed sandbox attempts (the nodes' kubelet logs: all, Multus' GetPod timed out, whereabouts, sriov, other): with VF $(<"$SC_DIR/failures-vf"); without $(<"$SC_DIR/failures-novf")"
	echo "  with VF, each ADD's wait for whereabouts' one cluster-wide Lease (kube-system/whereabouts), from its logs: $(<"$SC_DIR/lease-vf")"
}

# sc_lease_wait PREFIX prints how long PREFIX's pods' whereabouts ADDs
# waited for whereabouts' leader election (one Lease for the cluster, so
# the allocations of a burst run one after another): "Beginning IPAM" to
# "IPManagement -- mode: 0" of each container, in whole seconds.
sc_lease_wait() {
	cat "$RUN"/logs/whereabouts-s*.log 2>/dev/null | awk -v p="podRef: \"default/$1-" '
		function ts(x,  a) { split(x, a, /[T:Z]/); return a[2] * 3600 + a[3] * 60 + a[4] }
		/Beginning IPAM for ContainerID/ { match($0, /ContainerID: "[0-9a-f]+"/); id = substr($0, RSTART + 14, 12); b[id] = $1; if (index($0, p)) mine[id] = 1 }
		/IPManagement -- mode: 0/ { match($0, /containerID: "[0-9a-f]+"/); e[substr($0, RSTART + 14, 12)] = $1 }
		END { for (id in mine) if (id in e) print ts(e[id]) - ts(b[id]) }' | sort -n |
		awk '{ a[NR] = $1; s += $1 } END { if (NR) printf "%d ADDs, mean %.1f s, p50 %d s, p90 %d s, max %d s\n", NR, s / NR, a[int(NR / 2) + 1], a[int(NR * 0.9)], a[NR]; else print "none found" }'
}

# sc_failures PREFIX prints "all getpod whereabouts sriov other": the
# sandboxes of PREFIX's pods that failed to start, from the nodes'
# kubelet logs, by what failed: Multus' GetPod (its thin plugin gives the
# API server 250 ms a request, 2.5 s in all: pkg/multus/multus.go
# shortPollDuration, shortPollTimeout), whereabouts, the sriov CNI.
sc_failures() {
	cat "$RUN"/logs/kubelet-s*.log 2>/dev/null | grep 'kuberuntime_sandbox.go.*"Failed to create sandbox for pod"' |
		grep -F "pod=\"default/$1-" | awk '{ t++ } /error waiting for pod/ { g++; next } /whereabouts/ { w++; next } /sriov/ { s++; next } { o++ }
			END { printf "%d %d %d %d %d\n", t, g, w, s, o }'
}

# ------------------------------------------------------------ 8 GPUs, 8 VFs

# sc_8gpu: one pod a node with 8 GPUs and 8 VFs on 8 networks (a NAD a
# rail, each its own whereabouts range 192.168.1<rail>.0/24): the shape
# of deployments/examples/training-pod-8gpu.yaml.
sc_8gpu() {
	local i nets pod n vfs pfs bad=() uid pid status hcas ok=0
	for ((i = 0; i < TN_RAILS; i++)); do
		jq -n --arg name "${SC_RAIL_NADS[i]}" --arg res "$RESOURCE" --arg range "192.168.1$i.0/24" '
			{apiVersion: "k8s.cni.cncf.io/v1", kind: "NetworkAttachmentDefinition",
			 metadata: {name: $name, annotations: {"k8s.v1.cni.cncf.io/resourceName": $res}},
			 spec: {config: ({cniVersion: "0.3.1", type: "sriov", name: $name, ipam: {type: "whereabouts", range: $range}} | tojson)}}'
	done | jq -s '{apiVersion: "v1", kind: "List", items: .}' | kubectl apply -f - >/dev/null
	nets=$(IFS=,; echo "${SC_RAIL_NADS[*]}")
	kubectl create --dry-run=client -o json -f "$REPO/deployments/examples/training-pod-8gpu.yaml" |
		jq --argjson n "$SC_N" --arg nets "$nets" --arg img "$WORKLOAD_IMAGE" --arg lab "$SC_LABEL" '
		del(.status) as $p | {apiVersion: "v1", kind: "List", items: [range($n) as $i | $p
			| .metadata.name = "train8-\($i)" | .metadata.labels[$lab] = "train8"
			| .metadata.annotations["k8s.v1.cni.cncf.io/networks"] = $nets
			| .spec.containers[0].image = $img
			| .spec.containers[0].resources.requests.cpu = "10m"
			| .spec.containers[0].resources.requests.memory = "16Mi" | .spec.containers[0].resources.limits.memory = "64Mi"]}' \
			>"$SC_DIR/train8.json"
	kubectl create -f "$SC_DIR/train8.json" >/dev/null
	check "$SC_N pods of 8 GPUs, 8 VFs and 8 networks (deployments/examples/training-pod-8gpu.yaml, a NAD a rail) Running" \
		wait_for "$SC_RUNNING_BOUND" "train8 Running" sc_all_running train8 "$SC_N"
	expect "one 8-GPU pod on each node" "$(sc_each 1 "$SC_N")" "$(sc_per_node train8)"
	sc_assignments train8 | sort >"$SC_DIR/train8-vfs"
	sc_pods_json train8 >"$SC_DIR/train8-pods.json"
	for ((i = 0; i < SC_N; i++)); do
		pod=train8-$i
		n=$(jq -r --arg p "$pod" '.items[] | select(.metadata.name == $p) | .spec.nodeName' "$SC_DIR/train8-pods.json")
		n=${n#fastpath-e2e-}
		uid=$(jq -r --arg p "$pod" '.items[] | select(.metadata.name == $p) | .metadata.uid' "$SC_DIR/train8-pods.json")
		mapfile -t vfs < <(awk -v p="$pod" '$2 == p { print $3 }' "$SC_DIR/train8-vfs")
		pfs=$(for vf in "${vfs[@]}"; do tn_vf_field "$n" "$vf" pfAddress; done | sort -u | wc -l)
		((${#vfs[@]} == 8 && pfs == 8)) || bad+=("$pod: ${#vfs[@]} VFs on $pfs PFs")
		status=$(jq -r --arg p "$pod" '.items[] | select(.metadata.name == $p) | .metadata.annotations["k8s.v1.cni.cncf.io/network-status"] // "[]"' "$SC_DIR/train8-pods.json")
		# net1 … net8: each a NAD of its own, an address of that NAD's range, one of the pod's VFs.
		jq_true --argjson vfs "$(printf '%s\n' "${vfs[@]}" | jq -R . | jq -s .)" '
			[.[] | select(.interface | test("^net[1-8]$"))] as $s
			| ($s | length) == 8 and ([$s[].name] | unique | length) == 8
			and ([$s[] | .name as $nad | .ips[0] | startswith("192.168.1" + ($nad | ltrimstr("default/sriov-rail-")) + ".")] | all)
			and ([$s[] | .["device-info"].pci["pci-address"]] | sort) == ($vfs | sort)' <<<"$status" ||
			bad+=("$pod: network-status is not net1-net8 on 8 NADs with their ranges and its VFs")
		hcas=$(for vf in "${vfs[@]}"; do echo "$(tn_vf_field "$n" "$vf" rdmaDevice):1"; done | sort | paste -sd,)
		if pid=$(sc_pod_pid "$n" "$uid"); then
			[[ $(pod_env "$pid" NCCL_IB_HCA | sed 's/^=//' | tr ',' '\n' | sort | paste -sd,) == "$hcas" ]] ||
				bad+=("$pod: NCCL_IB_HCA $(pod_env "$pid" NCCL_IB_HCA), not its 8 devices")
			[[ $(nsenter -t "$pid" -n ip -br link | grep -c '^net[1-8]@\?') == 8 ]] || bad+=("$pod: not 8 net interfaces in the container")
			echo "$pod $n $pid" >>"$SC_DIR/train8-pids"
		else
			bad+=("$pod: no container process")
		fi
	done
	expect "each 8-GPU pod: 8 VFs on 8 PFs (all 8 rails), net1-net8 on the 8 NADs with their ranges and VFs, NCCL_IB_HCA names its 8 RDMA devices" \
		"" "$(sc_problems "${bad[@]}")"
	# Rail by rail, the first node's pod to the second's.
	local p0 p1 ip
	p0=$(awk '{ print $3; exit }' "$SC_DIR/train8-pids" 2>/dev/null)
	p1=$(awk 'NR == 2 { print $1 }' "$SC_DIR/train8-pids" 2>/dev/null)
	for ((i = 0; i < TN_RAILS; i++)); do
		ip=$(jq -r --arg p "$p1" --arg nad "default/${SC_RAIL_NADS[i]}" '.items[] | select(.metadata.name == $p)
			| .metadata.annotations["k8s.v1.cni.cncf.io/network-status"] | fromjson | .[] | select(.name == $nad) | .ips[0]' "$SC_DIR/train8-pods.json" 2>/dev/null)
		local ifn
		ifn=$(nsenter -t "$p0" -n ip -4 -br addr 2>/dev/null | awk -v r="192.168.1$i." 'index($3, r) == 1 { sub(/@.*/, "", $1); print $1 }')
		[[ -n $ip && -n $ifn ]] && nsenter -t "$p0" -n "$SC_BUSYBOX" ping -c 1 -W 2 -I "$ifn" "$ip" >/dev/null 2>&1 && ok=$((ok + 1))
	done
	expect "ping on each of the 8 rails' networks between two 8-GPU pods on different nodes" "$TN_RAILS" "$ok"
	sc_delete train8
	sc_check_left "the 8-GPU pods deleted"
	kubectl delete network-attachment-definitions "${SC_RAIL_NADS[@]}" >/dev/null
}
sc_all_running() { [[ $(sc_phases "$1") == "0 $2 0" ]]; }
sc_settled() { [[ $(sc_phases "$1") == 0\ * ]]; }

# ------------------------------------------------------------ churn

# sc_plugin_usage N prints node N's plugin process's RSS (kB) and open fds.
sc_plugin_usage() {
	local pid
	pid=$(tn_task "$1" "$DS_NS" "$(tn_plugin_pod "$1")" "$DS" 2) || { echo "- -"; return; }
	echo "$(awk '$1 == "VmRSS:" { print $2 }' "/proc/$pid/status") $(find "/proc/$pid/fd" -mindepth 1 | wc -l)"
}

# sc_churn: SC_CYCLES cycles of create SC_PODS → all Running → delete
# all; after each: no pod failed, nothing left (sc_left), and each node's
# plugin's RSS and fds.
sc_churn() {
	local c failed left leaked n t0 ok=0 st
	: >"$SC_DIR/churn"
	for ((c = 1; c <= SC_CYCLES; c++)); do
		t0=$(date +%s.%N)
		sc_create vf "churn$c" || true
		sc_times "churn$c" >"$SC_DIR/times-churn$c"
		failed=$(sc_pods_json "churn$c" | jq '[.items[] | select(.status.phase != "Running" or any(.status.containerStatuses[]?; .restartCount > 0))] | length')
		sc_delete "churn$c"
		wait_for 120 "nothing left after churn cycle $c" sc_nothing_left_now || true
		left=$(sc_left | wc -l)
		leaked=$(sc_ippool_release "churn$c")
		for n in "${SC_NODES[@]}"; do echo "$c $n $(sc_plugin_usage "$n")"; done >>"$SC_DIR/churn-usage"
		read -r -a st < <(sc_stats "$SC_DIR/times-churn$c")
		echo "$c ${st[0]} ${st[1]} ${st[2]} $failed $left $leaked $(sc_failures "churn$c") $(elapsed "$t0")" >>"$SC_DIR/churn"
		log "churn cycle $c: makespan ${st[0]}s p50 ${st[1]}s p99 ${st[2]}s, failed $failed, left $left, addresses whereabouts kept $leaked"
		((failed == 0 && left == 0)) && ok=$((ok + 1))
		[[ $left == 0 ]] || sc_left | head -n 5 | sed "s/^/  cycle $c: /" >&2
	done
	sc_churn_report
	expect "churn: $SC_CYCLES cycles of $SC_PODS pods created, Running, deleted: cycles with 0 failed pods, every VF home, allocatable exact, nothing left" \
		"$SC_CYCLES" "$ok"
}

sc_churn_report() {
	{
		echo "churn, $SC_CYCLES cycles of $SC_PODS pods (cycle, makespan p50 p99 s, failed pods, things left, addresses whereabouts' DEL kept, failed sandboxes: all, Multus GetPod, whereabouts, sriov, other; wall s):"
		sed 's/^/  /' "$SC_DIR/churn"
		echo "plugin per node, first cycle -> last: RSS (kB), open fds"
		awk -v last="$SC_CYCLES" '$1 == 1 { r0[$2] = $3; f0[$2] = $4; o[++n] = $2 } $1 == last { r1[$2] = $3; f1[$2] = $4 }
			END { for (i = 1; i <= n; i++) printf "  %-3s RSS %s -> %s  fds %s -> %s\n", o[i], r0[o[i]], r1[o[i]], f0[o[i]], f1[o[i]] }' \
			"$SC_DIR/churn-usage"
	} | tee "$SC_DIR/churn.txt" >&2
	# Flat within noise: fds within 10, RSS within 50 % (the Go heap's
	# GC target), first cycle against last.
	local grown
	grown=$(awk -v last="$SC_CYCLES" '$1 == 1 { r0[$2] = $3; f0[$2] = $4 } $1 == last && last > 1 {
			if ($4 > f0[$2] + 10 || $3 > r0[$2] * 1.5) printf "%s ", $2 }' "$SC_DIR/churn-usage")
	expect "churn: each node's plugin RSS and open fds flat, first cycle against last ($(sed -n '$p' "$SC_DIR/churn.txt" | xargs))" "" "$grown"
}

# ------------------------------------------------------------ faults

# sc_faults: a burst of SC_PODS pods, and during it node s2's plugin pod
# deleted, node s3's kubelet restarted, and pods deleted while
# ContainerCreating (their sandbox's DEL then runs while, or just after,
# its ADD). No pod stuck: each is Running, or gone when deleted, within
# SC_RUNNING_BOUND of the burst; no VF given to two pods; every VF back
# after the job is deleted.
sc_faults() {
	local prefix=fault old deleted=() refused=() t0 pods ph c
	local pnode=${SC_NODES[1]} knode=${SC_NODES[2]}
	old=$(tn_plugin_pod "$pnode")
	sc_job_list vf "$prefix" >"$SC_DIR/$prefix.json"
	t0=$(date +%s.%N)
	kubectl create -f "$SC_DIR/$prefix.json" >/dev/null
	kubectl -n "$DS_NS" delete pod "$old" --wait=false >/dev/null
	log "faults: node $pnode's plugin pod $old deleted"
	stop "kubelet-$knode"
	node_kubelet_start "$knode"
	log "faults: node $knode's kubelet restarted"
	# Pods in ContainerCreating (bound to a node, their sandbox not up),
	# deleted as they are: up to 4, on any node.
	wait_for 60 "pods in ContainerCreating" sc_creating "$prefix" || true
	mapfile -t deleted < <(sc_creating "$prefix" | head -n 4)
	if ((${#deleted[@]})); then kubectl delete pods "${deleted[@]}" --grace-period=1 --wait=false >/dev/null; fi
	log "faults: deleted while ContainerCreating: ${deleted[*]}"
	check "faults: pods deleted while ContainerCreating (${#deleted[@]}: ${deleted[*]})" test "${#deleted[@]}" -gt 0
	node_kubelet_ready "$knode" " (restarted during the burst)" 180
	require "node $pnode's plugin pod recreated and Ready" 180 tn_plugin_pod_ready "$pnode"
	# Settled: no pod Pending (one the kubelet refused, Failed, is not
	# stuck: it is counted below).
	# (|| true: a failed assignment would end the run under set -e, and
	# the expect below is what reports it)
	c=$(wait_for "$SC_RUNNING_BOUND" "the burst's pods settled" sc_settled "$prefix" && echo ok || true)
	ph=$(sc_phases "$prefix")
	if [[ $c != ok ]]; then
		# What did not settle, for the report: each such pod's node,
		# phase, reason and its last events.
		sc_pods_json "$prefix" | jq -r '.items[] | select(.status.phase == "Pending")
			| "\(.metadata.name) node=\(.spec.nodeName // "-") \(.status.reason // "") \([.status.containerStatuses[]?.state.waiting.reason] | join(","))"' |
			tee "$SC_DIR/$prefix-unsettled" | head -n 10 | while read -r l; do log "faults: not settled: $l"; done
		kubectl get events --sort-by=.lastTimestamp -o custom-columns=OBJ:.involvedObject.name,REASON:.reason,MSG:.message 2>/dev/null |
			grep -E "^$prefix-" | tail -n 20 >"$SC_DIR/$prefix-events" || true
	fi
	expect "faults: no pod stuck, none Pending ${SC_RUNNING_BOUND}s after the burst (settled in $(elapsed "$t0")s; pending, running, other: $ph)" \
		"ok" "$c"
	# Pods the kubelet of $pnode admitted while its plugin was being
	# replaced, and those $knode's restarted kubelet admitted again before
	# the plugin registered with it (it does within a second of the new
	# kubelet.sock, but the kubelet admits the node's pods first), are
	# refused: the device manager fails a pod whose devices are unhealthy
	# or unknown at admission (UnexpectedAdmissionError, "no healthy
	# devices present"). A bare pod stays Failed, a Job's is replaced. Any
	# other pod not Running is a failure.
	sc_pods_json "$prefix" >"$SC_DIR/$prefix-pods.json"
	# refused: one jq definition for both lists below.
	local refusedq='def refused: .status.phase == "Failed" and .status.reason == "UnexpectedAdmissionError"
		and (.spec.nodeName == $p or .spec.nodeName == $k);'
	local nodeargs=(--arg p "$(node_name "$pnode")" --arg k "$(node_name "$knode")")
	mapfile -t refused < <(jq -r "${nodeargs[@]}" "$refusedq"' .items[] | select(refused) | .metadata.name' "$SC_DIR/$prefix-pods.json")
	pods=$(jq -r "${nodeargs[@]}" "$refusedq"' .items[] | select(.status.phase != "Running" and (refused | not))
		| "\(.metadata.name) \(.spec.nodeName) \(.status.phase) \(.status.reason // "") \(.status.message // "" | .[:120])"' \
		"$SC_DIR/$prefix-pods.json" | head -n 5 | paste -sd';')
	log "faults: pods refused by node $pnode's kubelet while its plugin was replaced, or by node $knode's restarted kubelet before the plugin registered: ${#refused[@]} (${refused[*]})"
	expect "faults: every pod not deleted Running, but those refused by node $pnode's kubelet (plugin replaced) or node $knode's (kubelet restarted) (UnexpectedAdmissionError: ${#refused[@]})" \
		"" "$pods"
	if ((${#refused[@]})); then
		# Created again, as a Job's controller would: they run.
		kubectl delete pods "${refused[@]}" --grace-period=1 --wait=true --timeout 60s >/dev/null
		jq --argjson names "$(printf '%s\n' "${refused[@]}" | jq -R . | jq -s .)" \
			'.items |= map(select(.metadata.name as $n | $names | index($n)))' "$SC_DIR/$prefix.json" | kubectl create -f - >/dev/null
		check "faults: the ${#refused[@]} refused pods, created again, Running within ${SC_RUNNING_BOUND}s" \
			wait_for "$SC_RUNNING_BOUND" "refused pods Running" sc_all_running "$prefix" $((SC_PODS - ${#deleted[@]}))
	fi
	sc_assignments "$prefix" | sort >"$SC_DIR/$prefix-vfs"
	expect "faults: no VF given to two pods ($(wc -l <"$SC_DIR/$prefix-vfs") VFs held)" \
		"$(wc -l <"$SC_DIR/$prefix-vfs")" "$(awk '{ print $1, $3 }' "$SC_DIR/$prefix-vfs" | sort -u | wc -l)"
	expect "faults: one VF a running pod" "$(sc_phases "$prefix" | cut -d' ' -f2)" "$(awk '{ print $2 }' "$SC_DIR/$prefix-vfs" | sort -u | wc -l)"
	sc_delete "$prefix"
	sc_check_left "the burst's job deleted" "$prefix"
}

# sc_creating PREFIX prints PREFIX's pods bound to a node whose sandbox is
# not up yet (ContainerCreating).
sc_creating() {
	sc_pods_json "$1" | jq -r '.items[] | select(.status.phase == "Pending" and .spec.nodeName != null and
		([.status.conditions[]? | select(.type == "PodReadyToStartContainers" and .status == "True")] | length == 0)
		and any(.status.containerStatuses[]?; .state.waiting.reason == "ContainerCreating")) | .metadata.name' | grep .
}

# ------------------------------------------------------------ clean-up

sc_nothing_left() {
	expect "scale phase: nothing left on the $SC_N nodes, the IPPool empty" "" "$(sc_left | head -n 5 | paste -sd';')"
	check "kubectl delete -k of the deployment ($SC_N nodes)" kubectl delete -k "$RUN/deploy-nodes-base" --timeout 180s
	kubectl delete -f "$CLUSTER_DIR/seed/sriov-net-ib.yaml" --ignore-not-found >/dev/null
}
