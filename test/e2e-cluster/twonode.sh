# shellcheck shell=bash
# The two-node phase of make e2e-cluster (sourced by run.sh), after the
# one-node phases: the host's node is taken out and two namespaced nodes
# join (nodes.sh), on one fabric. Node A is a DGX-like host without VFs
# (dgx-h100-novfs): the shipped provisioning component's policy, whose
# nodeSelector only A's labels match, makes its VFs, the kernel played by
# kernel-standin inside the node. Node B is a RoCE host (roce-cx6dx) with
# its VFs already there. One DaemonSet spec, one NAD, one whereabouts
# range; a training job of two pods, one per node, talks over net1; the
# scheduler places by VF capacity; faults on one node leave the other
# alone; pod start with and without a VF is timed.

TN_POLICY_LABEL=feature.node.kubernetes.io/network-sriov.capable # the shipped policy's nodeSelector
TN_JOB=nccl-job
TN_RANGE=192.168.2.0/24 # the seed's NAD
TN_NAD=sriov-net-ib
TN_RAILS=8 TN_NUMVFS=8 # the shipped policy on A
TN_BENCH_ROUNDS=${TN_BENCH_ROUNDS:-10}
# Bytes of the TCP stream over net1: busybox seq's output, the same on both
# ends and on the host.
TN_SEQ=500000

# ------------------------------------------------------------ helpers

tn_alloc() { kubectl get node "$(node_name "$1")" -o json | jq -r --arg r "$RESOURCE" '.status.allocatable[$r] // "0"'; }
tn_alloc_is() { [[ $(tn_alloc "$1") == "$2" ]]; }
# The DaemonSet binds --metrics-addr to the node's address (status.hostIP).
tn_metric() { node_exec "$1" curl -sf "http://$(node_ip "$1"):$METRICS_PORT/metrics" | awk -v n="$2{$3}" '$1 == n { v = $2 } END { print v + 0 }'; }
tn_registrations() { tn_metric "$1" fastpath_device_plugin_registrations_total "resource=\"$RESOURCE\",result=\"ok\""; }
tn_registered_above() { (($(tn_registrations "$1") > $2)); }
tn_plugin_pod() {
	kubectl -n "$DS_NS" get pods -l "app.kubernetes.io/name=$DS" --field-selector "spec.nodeName=$(node_name "$1")" \
		-o jsonpath='{.items[0].metadata.name}' 2>/dev/null
}
tn_plugin_pod_ready() {
	kubectl -n "$DS_NS" get pods -l "app.kubernetes.io/name=$DS" --field-selector "spec.nodeName=$(node_name "$1")" -o json |
		jq_true '.items | length == 1 and (.[0].metadata.deletionTimestamp == null) and
			any(.[0].status.conditions[]?; .type == "Ready" and .status == "True")'
}
# tn_ds_ready [N]: the DaemonSet is on N nodes (2), Ready and up to date on each.
tn_ds_ready() {
	kubectl -n "$DS_NS" get ds "$DS" -o json | jq_true --argjson n "${1:-2}" \
		'.status.desiredNumberScheduled == $n and .status.numberReady == $n and .status.updatedNumberScheduled == $n'
}
# tn_task N NS POD CONTAINER FIELD: field 1 (ID) or 2 (PID) of the pod's
# running container on node N.
tn_task() {
	local ids
	ids=$(node_ctr "$1" containers ls -q "labels.\"io.kubernetes.pod.namespace\"==$2,labels.\"io.kubernetes.pod.name\"==$3,labels.\"io.kubernetes.container.name\"==$4" | xargs)
	[[ -n $ids ]] && node_ctr "$1" tasks ls | awk -v ids=" $ids " -v f="$5" 'index(ids, " " $1 " ") && $3 == "RUNNING" { print $f }' | grep .
}
# tn_in N POD CMD...: CMD in the pod's container (the workload image's
# busybox), as kubectl exec would run it (this kubelet serves no exec).
tn_in() {
	local id
	id=$(tn_task "$1" default "$2" train 1) || return 1
	node_ctr "$1" tasks exec --exec-id "e2e-$RANDOM$RANDOM" "$id" "${@:3}"
}
tn_vf_field() { jq -r --arg a "$2" ".devices[] | select(.pciAddress == \$a) | .$3" "$(node_dir "$1")/discover.json"; }
tn_pool() { jq -r --arg r "$RESOURCE" '.pools[] | select(.resource == $r) | .devices[]' "$(node_dir "$1")/discover.json"; }
tn_discover() {
	"$WORK/bin/rdma-device-plugin" discover --host-root "$(node_dir "$1")/host" --config "$CONFIG" -o json >"$(node_dir "$1")/discover.json"
}
# tn_links N: node N's VF stand-ins on the node ("vf name mac" a line),
# from its discover output and its netns.
tn_links() {
	local n=$1
	jq -r --arg r "$RESOURCE" '(.pools[] | select(.resource == $r) | .devices) as $pool
		| .devices[] | select(.pciAddress as $a | $pool | index($a)) | "\(.pciAddress) \(.netdev)"' "$(node_dir "$n")/discover.json" |
		awk 'FNR == NR { name = $2; sub(/:$/, "", name); sub(/@.*/, "", name)
				for (i = 1; i < NF; i++) if ($i == "link/ether") mac[name] = $(i + 1)
				next }
			{ print $1, $2, mac[$2] }' <(ip -n "$(node_ns "$n")" -o link show) -
}
# tn_vfs_home N: every VF stand-in of node N is in the node's netns under
# its name with its MAC ($RUN/nodes/N/vf-macs).
tn_vfs_home() { [[ $(tn_links "$1") == "$(<"$(node_dir "$1")/vf-macs")" ]]; }
# tn_numvfs HOST: each PF's sriov_numvfs ("address n" a line).
tn_numvfs() {
	local d
	for d in "$1"/sys/bus/pci/devices/*; do
		if [[ -f $d/sriov_numvfs ]]; then echo "$(basename "$d") $(<"$d/sriov_numvfs")"; fi
	done
}

# tn_pod_json NAME [VFS] [NODE] [NETWORK] [LABELS] prints a training pod:
# the workload image, VFS VFs of $RESOURCE (none: no VF), on NODE when
# given (a nodeSelector: the scheduler still places it), with the seed's
# NAD when NETWORK is "net". Its command says whether net1 was up when it
# started, and it exits on SIGTERM (deleting it takes no grace period).
tn_pod_json() {
	local name=$1 vfs=${2:-0} node=${3:-} net=${4:-} labels=${5:-'{}'}
	jq -n --arg name "$name" --arg img "$WORKLOAD_IMAGE" --arg res "$RESOURCE" --argjson vfs "$vfs" \
		--arg node "$node" --arg net "$net" --arg nad "$TN_NAD" --argjson labels "$labels" '
	{apiVersion: "v1", kind: "Pod",
	 metadata: ({name: $name, labels: $labels}
		+ (if $net == "net" then {annotations: {"k8s.v1.cni.cncf.io/networks": $nad}} else {} end)),
	 spec: ({terminationGracePeriodSeconds: 1,
		containers: [{name: "train", image: $img,
			command: ["sh", "-c", (if $net == "net"
				then "ip -o link show net1 | grep -q \"[<,]UP[,>]\" && echo net1-up; trap \"exit 0\" TERM; sleep 3600 & wait"
				else "echo started; trap \"exit 0\" TERM; sleep 3600 & wait" end)],
			securityContext: {capabilities: {add: ["IPC_LOCK"]}},
			resources: ({requests: {cpu: "10m", memory: "16Mi"}, limits: {memory: "64Mi"}}
				| if $vfs > 0 then .requests[$res] = ($vfs | tostring) | .limits[$res] = ($vfs | tostring) else . end)}]}
		+ (if $node != "" then {nodeSelector: {"kubernetes.io/hostname": $node}} else {} end))}'
}

# ------------------------------------------------------------ the phase

test_two_nodes() {
	phase "two nodes, one fabric: node A $(basename "$TN_FIXTURE_A") provisioned by the policy, node B $(basename "$TN_FIXTURE_B") with its VFs"
	local t0
	t0=$(date +%s.%N)
	tn_nodes_up
	tn_deploy
	log "two-node phase: nodes up and deployed in $(elapsed "$t0")s"
	tn_job
	tn_capacity
	tn_kubelet_restart_b
	tn_plugin_pod_a
	tn_pf_down_a
	tn_job_delete
	tn_bench
	tn_nothing_left
	log "two-node phase done in $(elapsed "$t0")s"
}
TN_FIXTURE_A=$REPO/testdata/sysfs/dgx-h100-novfs
TN_FIXTURE_B=$REPO/testdata/sysfs/roce-cx6dx

# tn_nodes_up takes the host's node out (its kubelet and containerd
# stopped, the Node deleted) and brings up nodes A and B and the fabric.
tn_nodes_up() {
	if running kubelet; then
		stop kubelet
		local rroot=$C/runc/k8s.io id p
		for id in $(runc --root "$rroot" list -q 2>/dev/null); do
			runc --root "$rroot" kill "$id" KILL 2>/dev/null
			runc --root "$rroot" delete --force "$id" 2>/dev/null
		done
		stop containerd
		for p in /proc/[0-9]*; do
			if [[ $(readlink "$p/exe" 2>/dev/null) == "$WORK/bin/containerd-shim-runc-v2" ]]; then kill -KILL "${p#/proc/}" 2>/dev/null; fi
		done
		check "the host's node $NODE taken out: its kubelet and containerd stopped, kubectl delete node" \
			kubectl delete node "$NODE" --wait=true --timeout 60s
	fi
	fabric_up
	local n i=1
	node_up a "$TN_FIXTURE_A"
	node_up b "$TN_FIXTURE_B"
	# PF stand-ins: A's rails (the policy's pfNames), B's PFs of its pool
	# VFs; both ends in the node.
	grep -o '"ibp[0-9]*s0"' "$REPO/deployments/components/provision/policies.yaml" | tr -d '"' |
		awk '{ p = $1; sub(/^ib/, "", p); print $1, "s" p }' >"$(node_dir a)/pf-standins"
	tn_discover b
	for n in $(tn_pool b); do tn_vf_field b "$(tn_vf_field b "$n" pfAddress)" netdev; done | sort -u |
		awk '{ print $1, "s" $1 }' >"$(node_dir b)/pf-standins"
	for n in a b; do node_pf_standins "$n" "$(node_dir "$n")/pf-standins"; done
	# B's VFs are there: their stand-ins now, each far end on the fabric.
	for n in $(tn_pool b); do echo "$n $(tn_vf_field b "$n" netdev)"; done >"$(node_dir b)/vf-standins"
	node_vf_standins b "$(node_dir b)/vf-standins"
	tn_links b >"$(node_dir b)/vf-macs"
	check "node B: $(wc -l <"$(node_dir b)/vf-standins") VF stand-ins in its netns, their far ends on the fabric" \
		test "$(ip -n "$FABRIC_NS" -o link show master "$FABRIC_BRIDGE" | grep -c ' b-')" = "$(wc -l <"$(node_dir b)/vf-standins")"
	for n in a b; do
		node_cni "$n" "$i"
		i=$((i + 1))
		node_containerd "$n"
		node_kubelet "$n"
	done
	# A's kernel: kernel-standin in the node, making each VF's netdev in
	# A's netns as the VF is probed.
	node_kernel_standin a
	require "node A: kernel stand-in watches its host's sysfs" 30 node_kernel_standin_watching a
	check "the nodes' netns are their own: A has no link of B's (ens1f0v0), B none of A's (ibp24s0)" \
		bash -c "! ip -n $(node_ns a) link show ens1f0v0 >/dev/null 2>&1 && ! ip -n $(node_ns b) link show ibp24s0 >/dev/null 2>&1"
	check "the nodes' mounts are their own: B's /var/lib/kubelet/device-plugins/kubelet.sock is its own, not A's or the host's" \
		tn_own_kubelet_sock b
}

# tn_deploy applies one overlay to both nodes: deployments/ as shipped
# with components/provision (its policy as shipped: the seed's 8 VFs on
# each IB rail, nodeSelector $TN_POLICY_LABEL), the image, the host root
# $NODE_HOST (each node's own fixture), the API server's address.
tn_deploy() {
	tn_overlay
	check "one DaemonSet spec for both nodes: components/provision with its shipped policy (nodeSelector $TN_POLICY_LABEL), host root $NODE_HOST" \
		tn_rendered "$RUN/deploy-nodes.yaml"
	kubectl label node "$(node_name a)" "$NFD_LABEL=true" "$TN_POLICY_LABEL=true" >/dev/null
	kubectl label node "$(node_name b)" "$NFD_LABEL=true" >/dev/null
	tn_numvfs "$(node_dir b)/host" >"$(node_dir b)/numvfs-before"
	local host_sriov
	host_sriov=$(tn_host_sriov)
	check "kubectl apply -k of the overlay (both nodes)" kubectl apply -k "$RUN/deploy-nodes-base"
	require "DaemonSet $DS_NS/$DS Ready on both nodes" 240 tn_ds_ready
	check "the init containers installed sriov into each node's own /opt/cni/bin (A's, B's)" \
		bash -c "[[ -x $(node_path a /opt/cni/bin)/sriov && -x $(node_path b /opt/cni/bin)/sriov ]]"
	expect "the host's /opt/cni/bin/sriov untouched by the nodes' init containers (inode, mtime; none without the one-node phases)" \
		"$host_sriov" "$(tn_host_sriov)"
	require "node A: the policy's $((TN_RAILS * TN_NUMVFS)) VFs made and served (allocatable $RESOURCE)" 120 \
		tn_alloc_is a $((TN_RAILS * TN_NUMVFS))
	require "node B: allocatable $RESOURCE = 8 (its own VFs)" 60 tn_alloc_is b 8
	expect "node A: sriov_numvfs of its PFs, written by the plugin ($TN_NUMVFS on each of the $TN_RAILS rails)" \
		"$(printf "$TN_NUMVFS %.0s" $(seq $TN_RAILS))" "$(tn_numvfs "$(node_dir a)/host" | awk '$2 != 0 { printf "%s ", $2 }')"
	expect "node A: fastpath_provision_vfs_desired{pf=$RAIL0} = $TN_NUMVFS (its labels matched)" "$TN_NUMVFS" \
		"$(tn_metric a fastpath_provision_vfs_desired "pf=\"$RAIL0\",policy=\"ib-rails\"")"
	check "node B: every PF's sriov_numvfs as before (the policy's nodeSelector does not match B)" \
		same_file "$(node_dir b)/numvfs-before" tn_numvfs "$(node_dir b)/host"
	tn_doctor_b
	# A's VFs: their far ends (made in A by the kernel stand-in) onto the fabric.
	tn_discover a
	mapfile -t peers < <(awk '{ print $2 }' "$(node_dir a)/vf-links")
	expect "node A: the kernel stand-in made a veth per VF" "$((TN_RAILS * TN_NUMVFS))" "${#peers[@]}"
	fabric_attach a "${peers[@]}"
	tn_links a >"$(node_dir a)/vf-macs"
	expect "fabric: the far ends of A's and B's VFs are its ports" "$((TN_RAILS * TN_NUMVFS + 8))" \
		"$(ip -n "$FABRIC_NS" -o link show master "$FABRIC_BRIDGE" | wc -l)"
}

# tn_overlay writes $RUN/deploy-nodes-base, the overlay of the nodes'
# phases (the same as the one-node phase's, checks.sh, on $NODE_HOST), and
# renders it into $RUN/deploy-nodes.yaml.
tn_overlay() {
	local HOST=$NODE_HOST host_volumes
	host_volumes=$(host_volumes "$HOST")
	write_overlay "$RUN/deploy-nodes-base" "$(realpath --relative-to="$RUN/deploy-nodes-base" "$REPO/deployments")" <<EOF
images:
  - name: ghcr.io/fastpath-k8s/fastpath
    newName: ${FASTPATH_IMAGE%:*}
    newTag: "${FASTPATH_IMAGE##*:}"
patches:
  - target: {kind: DaemonSet, name: $DS}
    patch: '{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "$DS", "namespace": "$DS_NS"},
      "spec": {"template": {"spec": {"volumes": $host_volumes}}}}'
  - target: {kind: DaemonSet, name: $DS}
    patch: |-
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --node-root=$HOST}
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_HOST, value: "$API_HOST"}}
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}}
  - target: {kind: DaemonSet, name: $DS}
    patch: '{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "$DS", "namespace": "$DS_NS"},
      "spec": {"template": {"spec": {"volumes": [{"name": "sys-devices", "hostPath": {"path": "$HOST/sys/devices"}},
        {"name": "sys-bus-pci", "hostPath": {"path": "$HOST/sys/bus/pci"}}]}}}}'
components: [$(realpath --relative-to="$RUN/deploy-nodes-base" "$REPO/deployments/components/provision")]
EOF
	kubectl kustomize "$RUN/deploy-nodes-base" >"$RUN/deploy-nodes.yaml"
}

# tn_rendered FILE: provision_rendered of FILE with the nodes'
# host root.
tn_rendered() { HOST=$NODE_HOST provision_rendered "$1"; }

# tn_own_kubelet_sock N: node N's /var/lib/kubelet is its own.
tn_own_kubelet_sock() {
	local in out other
	in=$(node_exec "$1" stat -c %i /var/lib/kubelet/device-plugins/kubelet.sock) || return 1
	out=$(stat -c %i "$(node_path "$1" /var/lib/kubelet)/device-plugins/kubelet.sock") || return 1
	other=$(stat -c %i "$(node_path a /var/lib/kubelet)/device-plugins/kubelet.sock") || return 1
	[[ $in == "$out" && $in != "$other" && $in != "$(stat -c %i /var/lib/kubelet/device-plugins/kubelet.sock 2>/dev/null)" ]]
}
tn_host_sriov() { stat -c '%i %Y' /opt/cni/bin/sriov 2>/dev/null || echo none; }
same_file() { [[ $("${@:2}") == "$(<"$1")" ]]; }

# tn_doctor_b runs doctor --policy in B's plugin container (as kubectl
# exec would): it says why the policy does not apply on B.
tn_doctor_b() {
	local id out
	id=$(tn_task b "$DS_NS" "$(tn_plugin_pod b)" "$DS" 1) || true
	node_ctr b tasks exec --exec-id "doctor-$RANDOM" "$id" /usr/bin/rdma-device-plugin doctor \
		--policy /etc/fastpath-policies/policies.yaml -o json >"$RUN/logs/doctor-b.json" 2>>"$RUN/logs/doctor-b.json" || true
	out=$(jq -r '[.checks[] | select(.name == "provision") | .message] | join("; ")' "$RUN/logs/doctor-b.json" 2>/dev/null)
	check "node B: doctor --policy says why: ${out:0:200}" grep -q "does not match this node's labels" <<<"$out"
}

# ------------------------------------------------------------ the job

# tn_job: two pods of one training job, pod anti-affinity on the
# hostname, each one VF and the seed's NAD.
tn_job() {
	kubectl apply -f "$CLUSTER_DIR/seed/sriov-net-ib.yaml" >/dev/null
	local i
	for i in 0 1; do
		tn_pod_json "$TN_JOB-$i" 1 "" net "{\"job\": \"$TN_JOB\"}" |
			jq --arg j "$TN_JOB" '.spec.affinity = {podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [
				{labelSelector: {matchLabels: {job: $j}}, topologyKey: "kubernetes.io/hostname"}]}}'
	done | jq -s '{apiVersion: "v1", kind: "List", items: .}' | kubectl apply -f - >/dev/null
	require "job pods $TN_JOB-0 and -1 Running" 120 tn_job_running
	local nodes
	nodes=$(kubectl get pods -l "job=$TN_JOB" -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort | xargs)
	expect "the job's two pods on two nodes (anti-affinity)" "$(node_name a) $(node_name b)" "$nodes"
	local p n ips=()
	for p in "$TN_JOB-0" "$TN_JOB-1"; do
		n=$(kubectl get pod "$p" -o jsonpath='{.spec.nodeName}')
		n=${n##*-}
		tn_check_job_pod "$n" "$p"
		ips+=("$TN_IP")
		eval "TN_POD_$n=$p TN_IP_$n=$TN_IP TN_VF_$n=$TN_VF TN_IF_$n=$TN_IF"
	done
	check "distinct whereabouts addresses from one range ($TN_RANGE): ${ips[*]}" test "${ips[0]}" != "${ips[1]}"
	expect "whereabouts IPPool $TN_RANGE holds both pods" "default/$TN_JOB-0 default/$TN_JOB-1" "$(ippool_pods "$TN_RANGE" | xargs)"
	tn_traffic "the job's start"
}

tn_job_running() { [[ $(kubectl get pods -l "job=$TN_JOB" -o jsonpath='{.items[*].status.phase}') == 'Running Running' ]]; }

# tn_check_job_pod N POD: the pod on node N got one of N's VFs, as net1 by
# its MAC with an address of the range, network-status as the container
# sees it, NCCL_IB_HCA naming N's RDMA device of that VF. Sets TN_VF,
# TN_IP, TN_IF.
tn_check_job_pod() {
	local n=$1 pod=$2 vf mac ifname addr status pid rdma
	TN_VF= TN_IP= TN_IF=
	vf=$(node_podres "$n" list --pod "default/$pod" --resource "$RESOURCE" | cut -f4) || true
	check "$pod on node $n: PodResources of node $n gives it one VF of node $n's pool ($vf)" \
		grep -qx -- "${vf:-none}" <(tn_pool "$n")
	mac=$(awk -v vf="$vf" '$1 == vf { print $3 }' "$(node_dir "$n")/vf-macs")
	pid=$(tn_task "$n" default "$pod" train 2) || true
	ifname=$(nsenter -t "$pid" -n ip -br link 2>/dev/null | awk -v m="$mac" '$3 == m { sub(/@.*/, "", $1); print $1 }') || true
	expect "$pod: its VF's stand-in $(tn_vf_field "$n" "$vf" netdev) is net1 in the pod (by MAC $mac)" net1 "$ifname"
	addr=$(nsenter -t "$pid" -n ip -4 -br addr show net1 2>/dev/null | awk '{ print $3 }') || true
	check "$pod: net1 has a whereabouts address in $TN_RANGE ($addr)" matches "$addr" '^192\.168\.2\.[0-9]+/24$'
	status=$(kubectl get pod "$pod" -o json | jq -r '.metadata.annotations["k8s.v1.cni.cncf.io/network-status"] // "[]"')
	check "$pod: network-status is what the container sees: net1, default/$TN_NAD, ${addr%/*}, MAC $mac, device-info $vf" \
		jq_true --arg ip "${addr%/*}" --arg mac "$mac" --arg a "$vf" --arg n "default/$TN_NAD" \
		'[.[] | select(.interface == "net1")] | length == 1 and (.[0] | .name == $n and .ips == [$ip] and .mac == $mac
			and .["device-info"].pci["pci-address"] == $a)' <<<"$status"
	rdma=$(tn_vf_field "$n" "$vf" rdmaDevice)
	expect "$pod: NCCL_IB_HCA names node $n's RDMA device of its VF" "=$rdma:1" "$(pod_env "$pid" NCCL_IB_HCA)"
	check "$pod: $rdma is node $n's (its fixture's class/infiniband, under the VF)" \
		test -e "$(node_dir "$n")/host/sys/bus/pci/devices/$vf/infiniband/$rdma"
	TN_VF=$vf TN_IP=${addr%/*} TN_IF=$ifname
}

# tn_rx_bytes PID: bytes received on net1 in PID's netns (/proc/net/dev is
# the reader's netns; /sys is the host's).
tn_rx_bytes() { nsenter -t "$1" -n awk '$1 == "net1:" { print $2 }' /proc/net/dev; }

# tn_traffic WHEN: the job's pods exchange data over net1: ping both ways,
# and a TCP stream from A's pod to B's with busybox nc, counted on B's
# net1.
tn_traffic() {
	local when=$1 want got rx0 rx1 pid_b
	check "ping over net1, A's pod to B's ($TN_IP_b), after $when" tn_in a "$TN_POD_a" ping -c 2 -W 2 -I net1 "$TN_IP_b"
	check "ping over net1, B's pod to A's ($TN_IP_a), after $when" tn_in b "$TN_POD_b" ping -c 2 -W 2 -I net1 "$TN_IP_a"
	pid_b=$(tn_task b default "$TN_POD_b" train 2) || true
	rx0=$(tn_rx_bytes "$pid_b") || true
	want=$("$WORK/debs/busybox-static/bin/busybox" seq "$TN_SEQ" | md5sum | cut -d' ' -f1)
	tn_in b "$TN_POD_b" rm -f /dev/shm/recv
	# The listener's stdin stays open (busybox nc stops at its stdin's end);
	# it exits, writing the sum, when A's nc closes the connection.
	tn_in b "$TN_POD_b" sh -c "sleep 20 | nc -l -p 5001 | md5sum >/dev/shm/recv" >/dev/null 2>&1 &
	wait_for 10 "B's pod listens on 5001" tn_in b "$TN_POD_b" sh -c "netstat -ltn | grep -q ':5001 '" || true
	tn_in a "$TN_POD_a" sh -c "seq $TN_SEQ | nc $TN_IP_b 5001" || true
	wait_for 10 "the stream's sum on B" tn_in b "$TN_POD_b" grep -q . /dev/shm/recv || true
	got=$(tn_in b "$TN_POD_b" cat /dev/shm/recv | cut -d' ' -f1) || true
	rx1=$(tn_rx_bytes "$pid_b") || true
	expect "TCP stream of $("$WORK/debs/busybox-static/bin/busybox" seq "$TN_SEQ" | wc -c) bytes A -> B over net1 (busybox nc), after $when: md5" "$want" "$got"
	check "B's net1 received the stream ($((${rx1:-0} - ${rx0:-0})) bytes)" test $((${rx1:-0} - ${rx0:-0})) -ge "$("$WORK/debs/busybox-static/bin/busybox" seq "$TN_SEQ" | wc -c)"
}

# ------------------------------------------------------------ capacity

tn_unschedulable_msg() {
	kubectl get pod "$1" -o json | jq -r '.status.conditions[]? | select(.type == "PodScheduled" and .status == "False" and .reason == "Unschedulable") | .message'
}

tn_unschedulable() { [[ -n $(tn_unschedulable_msg "$1") ]]; }

# tn_capacity: more VFs than B has lands on A; more than any node has
# stays Pending with the scheduler's reason.
tn_capacity() {
	local more=$(($(tn_alloc b) + 1)) most msg
	most=$(($(tn_alloc a) + 1))
	{
		tn_pod_json "vfs-$more" "$more"
		tn_pod_json "vfs-$most" "$most"
	} | jq -s '{apiVersion: "v1", kind: "List", items: .}' | kubectl apply -f - >/dev/null
	require "pod vfs-$more ($more VFs, B has $(tn_alloc b)) Running" 120 pod_running default "vfs-$more"
	expect "pod vfs-$more placed on node A by its VF capacity" "$(node_name a)" "$(kubectl get pod "vfs-$more" -o jsonpath='{.spec.nodeName}')"
	expect "pod vfs-$more holds $more of A's VFs (A's PodResources)" "$more" \
		"$(node_podres a list --pod "default/vfs-$more" --resource "$RESOURCE" | wc -l)"
	wait_for 30 "vfs-$most unschedulable" tn_unschedulable "vfs-$most" || true
	msg=$(tn_unschedulable_msg "vfs-$most")
	expect "pod vfs-$most ($most VFs, more than any node has) is Pending" Pending "$(pod_phase default "vfs-$most")"
	check "the scheduler's reason names the VFs on both nodes: '$msg'" matches "$msg" "^0/2 nodes are available: 2 Insufficient $RESOURCE"
	kubectl delete pod "vfs-$more" "vfs-$most" --wait=false >/dev/null
}

# ------------------------------------------------------------ faults

# tn_pod_state N: the job pod's PID and VF on node N, to compare across a
# fault.
tn_pod_state() { echo "pid=$(tn_task "$1" default "$(eval echo "\$TN_POD_$1")" train 2) vf=$(node_podres "$1" list --pod "default/$(eval echo "\$TN_POD_$1")" --resource "$RESOURCE" | cut -f4)"; }

tn_pod_state_is() { [[ $(tn_pod_state "$1") == "$(<"$2")" ]]; }

# tn_watch_alloc N FILE: samples node N's allocatable every 0.5 s into
# FILE until FILE.stop appears (a background job); a failed read is no
# sample.
tn_watch_alloc() {
	local v
	: >"$2"
	while [[ ! -e $2.stop ]]; do
		v=$(tn_alloc "$1") && [[ -n $v ]] && echo "$v" >>"$2"
		sleep 0.5
	done
	return 0
}
tn_sampled_only() { [[ $(sort -u "$2" | xargs) == "$1" ]]; }

# tn_fault_begin OTHER starts sampling node OTHER's allocatable and keeps
# its job pod's state; tn_fault_end WHAT checks both, and the traffic.
tn_fault_begin() {
	TN_OTHER=$1 TN_OTHER_ALLOC=$(tn_alloc "$1") TN_OTHER_STATE=$(tn_pod_state "$1")
	rm -f "$RUN/alloc-$1" "$RUN/alloc-$1.stop"
	tn_watch_alloc "$1" "$RUN/alloc-$1" &
	TN_WATCH=$!
}
tn_fault_end() {
	local what=$1 o=$TN_OTHER
	touch "$RUN/alloc-$o.stop"
	wait "$TN_WATCH" 2>/dev/null || true
	check "$what: node ${o^^}'s allocatable stayed $TN_OTHER_ALLOC ($(wc -l <"$RUN/alloc-$o") samples)" \
		tn_sampled_only "$TN_OTHER_ALLOC" "$RUN/alloc-$o"
	expect "$what: node ${o^^}'s job pod keeps its container and VF" "$TN_OTHER_STATE" "$(tn_pod_state "$o")"
	tn_traffic "$what"
}

tn_kubelet_restart_b() {
	local regs before_b
	regs=$(tn_registrations b)
	before_b=$(tn_pod_state b)
	tn_fault_begin a
	stop kubelet-b
	node_kubelet b " (after restart)"
	check "node B's plugin registered again after its kubelet restart" wait_for 60 "registered again" tn_registered_above b "$regs"
	check "node B's allocatable back to 8" wait_for 30 "allocatable" tn_alloc_is b 8
	echo "$before_b" >"$RUN/job-b-before"
	# PodResources lists the pod's VF again once the restarted kubelet
	# has the pod back from the API server.
	wait_for 30 "B's job pod in PodResources" tn_pod_state_is b "$RUN/job-b-before" || true
	expect "node B's job pod keeps its container and VF across its kubelet's restart" "$before_b" "$(tn_pod_state b)"
	tn_fault_end "node B's kubelet restarted"
}

tn_plugin_pod_a() {
	local old b_pod b_uid
	old=$(tn_plugin_pod a)
	b_pod=$(tn_plugin_pod b)
	b_uid=$(kubectl -n "$DS_NS" get pod "$b_pod" -o jsonpath='{.metadata.uid}:{.status.containerStatuses[0].restartCount}')
	tn_fault_begin b
	kubectl -n "$DS_NS" delete pod "$old" --wait=true --timeout 60s >/dev/null
	require "node A's plugin pod recreated and Ready" 120 tn_plugin_pod_ready a
	check "node A's new plugin pod is another pod than $old" test "$(tn_plugin_pod a)" != "$old"
	check "node A's allocatable back to $((TN_RAILS * TN_NUMVFS))" wait_for 60 "allocatable" tn_alloc_is a $((TN_RAILS * TN_NUMVFS))
	expect "node B's plugin pod untouched (same UID, no restart)" "$b_uid" \
		"$(kubectl -n "$DS_NS" get pod "$b_pod" -o jsonpath='{.metadata.uid}:{.status.containerStatuses[0].restartCount}')"
	tn_fault_end "node A's plugin pod deleted and recreated"
}

tn_pf_down_a() {
	local pf pfaddr job_pf n want
	job_pf=$(tn_vf_field a "$(tn_vf_field a "$TN_VF_a" pfAddress)" netdev)
	pf=$(awk -v j="$job_pf" '$1 != j { print $1; exit }' "$(node_dir a)/pf-standins")
	pfaddr=$(jq -r --arg n "$pf" '.devices[] | select(.netdev == $n and .pfAddress == "") | .pciAddress' "$(node_dir a)/discover.json")
	n=$(jq --arg p "$pfaddr" '[.devices[] | select(.pfAddress == $p)] | length' "$(node_dir a)/discover.json")
	want=$((TN_RAILS * TN_NUMVFS - n))
	tn_fault_begin b
	ip -n "$(node_ns a)" link set "$pf" down
	check "node A's PF $pf down: its $n VFs leave A's allocatable ($want)" wait_for 15 "A down to $want" tn_alloc_is a "$want"
	ip -n "$(node_ns a)" link set "$pf" up
	check "node A's PF $pf up: A's allocatable back" wait_for 15 "A back" tn_alloc_is a $((TN_RAILS * TN_NUMVFS))
	tn_fault_end "node A's PF $pf down and up"
}

# ------------------------------------------------------------ clean-up

tn_job_delete() {
	kubectl delete pods -l "job=$TN_JOB" --wait=false >/dev/null
	require "job pods deleted" 120 tn_no_pods
	local n
	for n in a b; do
		check "node ${n^^}: every VF stand-in back in its netns under its name and MAC" wait_for 30 "VFs home" tn_vfs_home "$n"
	done
	expect "whereabouts IPPool $TN_RANGE empty" "" "$(ippool_pods "$TN_RANGE" | xargs)"
}

# tn_node_left N prints what is left of pods on node N: pod netns in its
# /run/netns, the sriov CNI's state (its tombstones, deleted-*.json, are
# none: docs/cni.md; nor is an attachment's lock file beside its
# tombstone, attach-<hash>.lock, which a DEL killed after it wrote the
# tombstone leaves: the sweep that removes the tombstone takes that lock
# and removes it), libcni's cache, Multus' cache, PodResources' pods,
# containers.
tn_node_left() {
	local n=$1 sriov f h
	sriov=$(node_path "$n" /var/lib/cni/sriov)
	find "$(node_path "$n" /run/netns)" "$sriov" "$(node_path "$n" /var/lib/cni/results)" \
		"$(node_dir "$n")/cni/multus" -mindepth 1 -type f ! -name 'deleted-*.json' 2>/dev/null |
		while read -r f; do
			h=${f#"$sriov"/attach-}
			[[ $f == "$sriov"/attach-*.lock && -f $sriov/deleted-${h%.lock}.json ]] || echo "${f#"$(node_dir "$n")"/}"
		done
	node_podres "$n" list | awk '$1 ~ /^default\// { print "podresources: " $1 }'
	node_ctr "$n" tasks ls -q | while read -r id; do
		node_ctr "$n" containers info "$id" | jq -r '.Labels["io.kubernetes.pod.namespace"] // ""' | grep -qx default && echo "task $id"
	done
	return 0
}

tn_nothing_left() {
	local n
	for n in a b; do
		check "node ${n^^}: every VF stand-in in its netns under its name and MAC" tn_vfs_home "$n"
		expect "node ${n^^}: nothing of the pods left (pod netns, sriov and libcni state, Multus cache, PodResources, containers)" "" \
			"$(tn_node_left "$n" | xargs)"
	done
	expect "whereabouts IPPool $TN_RANGE empty" "" "$(ippool_pods "$TN_RANGE" | xargs)"
	check "kubectl delete -k of the deployment (both nodes)" kubectl delete -k "$RUN/deploy-nodes-base" --timeout 120s
	kubectl delete -f "$CLUSTER_DIR/seed/sriov-net-ib.yaml" --ignore-not-found >/dev/null
}

# ------------------------------------------------------------ pod start

# tn_bench times pod start, created (the API server's answer to the
# create) to Running (the watch's event), TN_BENCH_ROUNDS rounds of one
# pod per node at once, first with a VF and the NAD (Running implies net1:
# the sandbox is up only after Multus and sriov returned; each container
# also says whether net1 was up when it started), then the same pods
# without a VF. Each round's pods are deleted, and gone, before the next.
tn_bench() {
	local dir=$RUN/bench kind r n t0 watcher
	mkdir -p "$dir"
	: >"$dir/events"
	# The watch's events, each stamped as it arrives; the kubectl's PID in
	# watch.pid (killing it ends the loop).
	{
		"$WORK/bin/kubectl" --kubeconfig "$KCFG/admin.kubeconfig" get pods -l fastpath-e2e/bench -w \
			-o jsonpath='{.metadata.name} {.status.phase}{"\n"}' 2>/dev/null &
		echo $! >"$dir/watch.pid"
		wait $!
	} | while read -r name ph; do echo "$EPOCHREALTIME $name $ph"; done >>"$dir/events" &
	watcher=$!
	: >"$dir/created"
	t0=$(date +%s.%N)
	for kind in vf novf; do
		for ((r = 0; r < TN_BENCH_ROUNDS; r++)); do
			for n in a b; do
				if [[ $kind == vf ]]; then
					tn_pod_json "bench-$kind-$r$n" 1 "$(node_name "$n")" net '{"fastpath-e2e/bench": "1"}'
				else
					tn_pod_json "bench-$kind-$r$n" 0 "$(node_name "$n")" "" '{"fastpath-e2e/bench": "1"}'
				fi >"$dir/bench-$kind-$r$n.json"
			done
			for n in a b; do
				tn_create "$dir/bench-$kind-$r$n.json" >>"$dir/created" &
			done
			wait_for 120 "round $r ($kind) Running" tn_round_running "$dir" "$kind-$r" ||
				fail "pod start round $r ($kind): not Running within 120s"
			# What each container said as it started (the kubelet removes a
			# deleted pod's logs).
			for n in a b; do
				wait_for 10 "bench-$kind-$r$n's log" tn_pod_said "$n" "bench-$kind-$r$n" || true
				echo "bench-$kind-$r$n $(tn_pod_log "$n" "bench-$kind-$r$n" | head -n1)" >>"$dir/said"
			done
			kubectl delete pods "bench-$kind-${r}a" "bench-$kind-${r}b" --wait=false >/dev/null
			wait_for 120 "round $r ($kind) gone" tn_no_pods || true
		done
	done
	log "pod start: $((2 * 2 * TN_BENCH_ROUNDS)) pods in $(elapsed "$t0")s"
	kill "$(<"$dir/watch.pid")" 2>/dev/null || true
	wait "$watcher" 2>/dev/null || true
	tn_bench_report "$dir"
}

# tn_create FILE creates the pod in FILE through the API server and prints
# "epoch name", epoch taken as the request went out.
tn_create() {
	local t=$EPOCHREALTIME
	curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" -H 'Content-Type: application/json' \
		--data-binary @"$1" "$API/api/v1/namespaces/default/pods" >/dev/null &&
		echo "$t $(jq -r .metadata.name "$1")"
}
tn_round_running() { [[ $(awk -v r="bench-$2" '$3 == "Running" && index($2, r) == 1 { print $2 }' "$1/events" | sort -u | wc -l) == 2 ]]; }
tn_pod_log() { cat "$(node_dir "$1")/pod-logs/default_$2_"*/train/*.log 2>/dev/null; }
tn_pod_said() { [[ -n $(tn_pod_log "$@") ]]; }
tn_no_pods() { [[ -z $(kubectl get pods -o name) ]]; }

# tn_bench_report DIR prints each kind's p50 and p90 (nearest rank) over
# its pods, and per node, into DIR/podstart.txt and the log.
tn_bench_report() {
	local dir=$1 kind
	awk 'FNR == NR { created[$2] = $1; next } $3 == "Running" && !($2 in running) { running[$2] = $1 }
		END { for (p in created) if (p in running) printf "%s %.3f\n", p, running[p] - created[p] }' \
		"$dir/created" "$dir/events" | sort >"$dir/starts"
	{
		echo "pod start, created -> Running ($(date -u +%FT%TZ), $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)):"
		for kind in vf novf; do
			grep "^bench-$kind-" "$dir/starts" | awk '{ print $2 }' | sort -n | awk -v k="$kind" '
				{ v[NR] = $1 } END {
					if (NR == 0) { print k ": none"; exit }
					p50 = v[int((NR * 50 + 99) / 100)]; p90 = v[int((NR * 90 + 99) / 100)]
					printf "  %-5s %2d pods  p50 %.2f s  p90 %.2f s  min %.2f s  max %.2f s\n", (k == "vf" ? "VF" : "no VF"), NR, p50, p90, v[1], v[NR] }'
		done
		local node
		for kind in vf novf; do
			for node in a b; do
				grep -E "^bench-$kind-[0-9]+$node " "$dir/starts" | awk '{ print $2 }' | sort -n |
					awk -v k="$kind" -v n="${node^^}" '{ v[NR] = $1 } END { if (NR) printf "  %-5s on %s: %2d pods  p50 %.2f s  p90 %.2f s\n",
						(k == "vf" ? "VF" : "no VF"), n, NR, v[int((NR * 50 + 99) / 100)], v[int((NR * 90 + 99) / 100)] }'
			done
		done
	} | tee "$dir/podstart.txt" >&2
	expect "pod start with a VF, created -> Running, timed on both nodes ($(sed -n '2p' "$dir/podstart.txt" | xargs))" \
		$((2 * TN_BENCH_ROUNDS)) "$(grep -c '^bench-vf-' "$dir/starts")"
	expect "pod start without a VF, timed on both nodes ($(sed -n '3p' "$dir/podstart.txt" | xargs))" \
		$((2 * TN_BENCH_ROUNDS)) "$(grep -c '^bench-novf-' "$dir/starts")"
	local up
	up=$(grep -c '^bench-vf-.* net1-up$' "$dir/said")
	expect "each pod with a VF had net1 up when its container started (its log)" $((2 * TN_BENCH_ROUNDS)) "$up"
}
