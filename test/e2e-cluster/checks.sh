# shellcheck shell=bash
# The checks of make e2e-cluster (sourced by run.sh), in the order a user
# meets them: deploy, the seed's pod, the examples, then what goes wrong on
# a node (PF link down, the plugin killed, the kubelet restarted), and the
# clean-up when the pods go.

DS_NS=fastpath
DS=rdma-device-plugin
NFD_LABEL=feature.node.kubernetes.io/pci-15b3.present
SEED_POD=nccl-seed
SEED_RANGE=192.168.2.0/24
EXAMPLE_POD=nccl-train
EXAMPLE8_POD=nccl-train-8gpu
EXAMPLE_RANGE=192.168.100.0/24

# ------------------------------------------------------------ helpers

# task_pid NS POD CONTAINER prints the host PID of the pod's running
# container; task_id its containerd ID.
task_pid() { running_task "$@" 2; }
task_id() { running_task "$@" 1; }
running_task() {
	local ids
	ids=$(ctr containers ls -q "labels.\"io.kubernetes.pod.namespace\"==$1,labels.\"io.kubernetes.pod.name\"==$2,labels.\"io.kubernetes.container.name\"==$3" | xargs)
	[[ -n $ids ]] && ctr tasks ls | awk -v ids=" $ids " -v f="$4" 'index(ids, " " $1 " ") && $3 == "RUNNING" { print $f }' | grep .
}

# pod_vfs NS/POD prints the pod's VFs (PodResources List), one a line.
pod_vfs() { podres list --pod "$1" --resource "$RESOURCE" | cut -f4; }
pod_env() { tr '\0' '\n' <"/proc/$1/environ" | sed -n "s/^$2=//p"; }
in_pod() { nsenter -t "$1" -n "${@:2}"; }
standin_of() { awk -v vf="$1" '$1 == vf { print $2 }' "$RUN/standins.mac"; }
mac_of() { awk -v vf="$1" '$1 == vf { print $4 }' "$RUN/standins.mac"; }
allocatable() { kubectl get node "$NODE" -o json | jq -r --arg r "$1" '.status.allocatable[$r] // "0"'; }
allocatable_is() { [[ $(allocatable "$1") == "$2" ]]; }
pod_phase() { kubectl -n "$1" get pod "$2" -o jsonpath='{.status.phase}' 2>/dev/null; }
pod_running() { [[ $(pod_phase "$1" "$2") == Running ]]; }
no_pod_tasks() { [[ -z $(ctr tasks ls -q 2>/dev/null) ]]; }
# metrics_host is the node's address, where the DaemonSet binds
# --metrics-addr ($(HOST_IP), status.hostIP), not loopback.
metrics_host() { kubectl get nodes -o jsonpath='{.items[0].status.addresses[?(@.type=="InternalIP")].address}'; }
# metric NAME LABELS prints the device plugin's counter (0 when absent).
metric() {
	curl -sf "http://$(metrics_host):$METRICS_PORT/metrics" | awk -v n="$1{$2}" '$1 == n { v = $2 } END { print v + 0 }'
}
registrations() { metric fastpath_device_plugin_registrations_total "resource=\"$RESOURCE\",result=\"ok\""; }
registrations_above() { (($(registrations) > $1)); }
restart_count() {
	kubectl -n "$DS_NS" get pods -l "app.kubernetes.io/name=$DS" -o jsonpath='{.items[0].status.containerStatuses[0].restartCount}'
}
restarted() { (($(restart_count) > $1)); }
plugin_log() { cat "$RUN"/pod-logs/"${DS_NS}_${DS}"-*/"$DS"/*.log 2>/dev/null; }
netlink_on() { plugin_log | grep -q '"msg":"starting"' && ! plugin_log | grep -q 'netlink unavailable'; }
# host_volumes prints the DaemonSet's hostPath volumes of the node's sysfs
# and devices, as shipped, each moved to the same path under fixture host $1
# (JSON, for the overlays' volume patches: checks.sh and twonode.sh).
host_volumes() {
	kubectl kustomize "$REPO/deployments" | kubectl create --dry-run=client -o json -f - |
		jq -s -c --arg h "$1" '[.[] | select(.kind == "DaemonSet") | .spec.template.spec.volumes[]
			| select(.hostPath.path // "" | test("^/(sys|dev)(/|$)")) | {name, hostPath: {path: ($h + .hostPath.path)}}]'
}
matches() { [[ $1 =~ $2 ]]; }
sriov_answers_version() { CNI_COMMAND=VERSION /opt/cni/bin/sriov </dev/null | jq_true '.supportedVersions | index("0.3.1") != null'; }
# doctor_cni_ok runs doctor in the plugin's container as kubectl exec
# would (this kubelet serves no exec): a process of the container's own
# spec — user, capabilities, environment, mounts — through containerd.
doctor_cni_ok() {
	local pod id
	pod=$(kubectl -n "$DS_NS" get pods -l "app.kubernetes.io/name=$DS" -o jsonpath='{.items[0].metadata.name}')
	id=$(task_id "$DS_NS" "$pod" "$DS") || return 1
	ctr tasks exec --exec-id "doctor-$RANDOM" "$id" /usr/bin/rdma-device-plugin doctor -o json >"$RUN/logs/doctor-in-pod.json" || true
	jq_true 'any(.checks[]; .name == "cni" and .status == "ok" and .subject == "/host/opt/cni/bin/sriov")' <"$RUN/logs/doctor-in-pod.json"
}
ds_ready() {
	kubectl -n "$DS_NS" get ds "$DS" -o json |
		jq_true '.status.desiredNumberScheduled == 1 and .status.numberReady == 1 and .status.updatedNumberScheduled == 1'
}

# write_overlay DIR RESOURCES... writes DIR/kustomization.yaml listing the
# resources (paths relative to DIR) and reads the rest from stdin.
write_overlay() {
	local dir=$1 r
	shift
	mkdir -p "$dir"
	{
		echo "apiVersion: kustomize.config.k8s.io/v1beta1"
		echo "kind: Kustomization"
		echo "resources:"
		for r in "$@"; do echo "  - $r"; done
		cat
	} >"$dir/kustomization.yaml"
}

# ------------------------------------------------------------ deploy

# test_deploy applies deployments/ as shipped, through kubectl's kustomize,
# with the only two things a test node needs changed (an overlay written
# here): the image (the one make image-tar built, in containerd) and the
# host root (the fixture's /sys and /dev/infiniband instead of the node's).
test_deploy() {
	# The DaemonSet's hostPath volumes of the node's sysfs and devices, as
	# shipped: each becomes the same path under the fixture host.
	local host_volumes
	host_volumes=$(host_volumes "$HOST")
	check "the DaemonSet mounts the node's sysfs and devices ($host_volumes)" \
		jq_true 'map(.hostPath.path) | any(endswith("/sys")) and any(test("/dev(/infiniband)?$"))' <<<"$host_volumes"
	write_overlay "$RUN/deploy" "$(realpath --relative-to="$RUN/deploy" "$REPO/deployments")" <<EOF
images:
  - name: ghcr.io/fastpath-k8s/fastpath
    newName: ${FASTPATH_IMAGE%:*}
    newTag: "${FASTPATH_IMAGE##*:}"
patches:
  # The fixture host stands for the node: its sys and dev go where the
  # DaemonSet mounts the node's, and --node-root tells the plugin where they
  # are on the node (the device paths it hands the kubelet).
  - target: {kind: DaemonSet, name: $DS}
    patch: '{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "$DS", "namespace": "$DS_NS"},
      "spec": {"template": {"spec": {"volumes": $host_volumes}}}}'
  - target: {kind: DaemonSet, name: $DS}
    patch: |-
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --node-root=$HOST}
EOF
	kubectl kustomize "$RUN/deploy" >"$RUN/deploy.yaml"
	check "kubectl kustomize deployments/ with the test's image and host root" \
		test "$(grep -c "image: $FASTPATH_IMAGE" "$RUN/deploy.yaml")" = 2
	# No NFD here: the node is labelled by hand, as the README says.
	kubectl label node "$NODE" "$NFD_LABEL=true" >/dev/null
	check "kubectl apply -k of the overlay" kubectl apply -k "$RUN/deploy"
	require "DaemonSet $DS_NS/$DS Ready on $NODE" 180 ds_ready
	check "init container installed /opt/cni/bin/sriov (answers CNI VERSION)" sriov_answers_version
	# doctor in the plugin's container, as the README runs it (kubectl
	# exec, no flag): the node's CNI bin_dir is mounted read-only under
	# /host, so it checks the sriov the init container installed, under the
	# shipped securityContext. Its exit status says what else it found on
	# the fixture host; only the cni check counts here.
	check "doctor in the plugin's container: its cni check is ok on /host/opt/cni/bin/sriov" doctor_cni_ok
	require "node allocatable $RESOURCE = $WANT_VFS" 60 allocatable_is "$RESOURCE" "$WANT_VFS"
	require "node allocatable $SHARED_RESOURCE = $WANT_SHARED" 30 allocatable_is "$SHARED_RESOURCE" "$WANT_SHARED"
	expect "device plugin registrations with the kubelet ($RESOURCE)" 1 "$(registrations)"
	# Issue 12 item 1: under the shipped securityContext (drop ALL) netlink
	# must still work, or link health falls back to periodic rescans.
	check "device plugin follows link events under the shipped securityContext (no 'netlink unavailable' in its log)" \
		netlink_on
}

# ------------------------------------------------------------ pods

# check_vf_in_pod POD PID VF RANGE checks that VF's stand-in is in the
# netns of PID as net<N>, found by its MAC, with a whereabouts address in
# RANGE; it sets VF_IFNAME and VF_ADDR (address/prefix).
check_vf_in_pod() {
	local pod=$1 pid=$2 vf=$3 range=$4 mac
	mac=$(mac_of "$vf")
	VF_IFNAME=$(in_pod "$pid" ip -br link 2>/dev/null | awk -v m="$mac" '$3 == m { sub(/@.*/, "", $1); print $1 }')
	check "$pod: $vf's stand-in $(standin_of "$vf") is in the pod as net<N> by MAC $mac (got '$VF_IFNAME')" \
		matches "$VF_IFNAME" '^net[0-9]+$'
	VF_ADDR=$(in_pod "$pid" ip -4 -br addr show "$VF_IFNAME" 2>/dev/null | awk '{ print $3 }')
	local prefix=${range%.*}
	check "$pod: $VF_IFNAME has a whereabouts address in $range ($VF_ADDR)" matches "$VF_ADDR" "^${prefix//./\\.}\\.[0-9]+/"
}

# check_pod NS POD CONTAINER NAD RANGE checks what a pod got for its VFs:
# the scheduler placed it, each VF's stand-in is a net<i> of the pod (by
# MAC) with a whereabouts address in RANGE, network-status names it with
# the VF's device-info, the container has exactly its VFs' char devices.
# Sets POD_VFS and POD_PID.
check_pod() {
	local ns=$1 pod=$2 ctr_name=$3 nad=$4 range=$5
	expect "$pod scheduled on $NODE" "$NODE" "$(kubectl -n "$ns" get pod "$pod" -o jsonpath='{.spec.nodeName}')"
	expect "$pod placed by the default scheduler (Scheduled event)" default-scheduler \
		"$(kubectl -n "$ns" get events --field-selector "involvedObject.name=$pod,reason=Scheduled" -o json | jq -r '[.items[] | .reportingComponent // .source.component] | unique | join(",")')"
	mapfile -t POD_VFS < <(pod_vfs "$ns/$pod")
	POD_PID=$(task_pid "$ns" "$pod" "$ctr_name")
	local status vf i=0 want_devs="" got_devs
	status=$(kubectl -n "$ns" get pod "$pod" -o json | jq -r '.metadata.annotations["k8s.v1.cni.cncf.io/network-status"] // "[]"')
	for vf in "${POD_VFS[@]}"; do
		i=$((i + 1))
		check_vf_in_pod "$pod" "$POD_PID" "$vf" "$range"
		local ifname=$VF_IFNAME addr=$VF_ADDR
		check "$pod: network-status has $ns/$nad on $ifname with device-info pci-address $vf" \
			jq_true --arg i "$ifname" --arg n "$ns/$nad" --arg a "$vf" --arg ip "${addr%/*}" \
			'any(.[]; .interface == $i and .name == $n and .["device-info"].type == "pci" and .["device-info"].pci["pci-address"] == $a and (.ips | index($ip)))' <<<"$status"
		want_devs+=" $(vf_field "$vf" 'charDevices[]' | xargs -n1 basename | xargs)"
	done
	want_devs=$(xargs -n1 <<<"$want_devs" | sort -u | xargs)
	got_devs=$(find "/proc/$POD_PID/root/dev/infiniband" -mindepth 1 -printf '%f\n' 2>/dev/null | sort | xargs)
	expect "$pod: /dev/infiniband holds exactly its VFs' char devices" "$want_devs" "$got_devs"
	expect "$pod: ${RESOURCE_ENV} names its VFs" "$(printf '%s\n' "${POD_VFS[@]}" | sort | paste -sd,)" \
		"$(pod_env "$POD_PID" "$RESOURCE_ENV" | tr ',' '\n' | sort | paste -sd,)"
}
RESOURCE_ENV=PCIDEVICE_MELLANOX_COM_MLNX_SRIOV_RDMA

# ippool_pods RANGE prints the pods holding an address of a whereabouts pool.
ippool_pods() {
	kubectl get ippools.whereabouts.cni.cncf.io -A -o json |
		jq -r --arg r "$1" '.items[] | select(.spec.range == $r) | .spec.allocations // {} | .[] | .podref' | sort
}

# test_seed_pod applies the seed's NAD and training pod, as they are but
# for the image.
test_seed_pod() {
	mkdir -p "$RUN/seed/seed-files"
	cp "$CLUSTER_DIR"/seed/*.yaml "$RUN/seed/seed-files/"
	write_overlay "$RUN/seed" seed-files/sriov-net-ib.yaml seed-files/training-pod.yaml <<EOF
namespace: default
images:
  - name: nvcr.io/nvidia/pytorch
    newName: ${WORKLOAD_IMAGE%:*}
    newTag: "${WORKLOAD_IMAGE##*:}"
EOF
	check "kubectl apply -k of the seed's NAD and pod" kubectl apply -k "$RUN/seed"
	require "pod $SEED_POD Running" 180 pod_running default "$SEED_POD"
	check_pod default "$SEED_POD" nccl sriov-net-ib "$SEED_RANGE"
	expect "$SEED_POD: one VF" 1 "${#POD_VFS[@]}"
	SEED_VF=${POD_VFS[0]}
	local rdma
	rdma=$(vf_field "$SEED_VF" rdmaDevice)
	expect "$SEED_POD: UCX_NET_DEVICES from the device plugin" "$rdma:1" "$(pod_env "$POD_PID" UCX_NET_DEVICES)"
	# Issue 12 item 3: the kubelet keeps the pod spec's value over the
	# device plugin's; the seed's hand-written PF name stays.
	expect "$SEED_POD: NCCL_IB_HCA is the pod spec's (the kubelet keeps it over the device plugin's =$rdma:1)" \
		mlx5_0 "$(pod_env "$POD_PID" NCCL_IB_HCA)"
	expect "whereabouts IPPool $SEED_RANGE holds the pod" "default/$SEED_POD" "$(ippool_pods "$SEED_RANGE" | xargs)"
}

# workload_overlay [--no-gpu] DIR FILES...: an overlay in DIR of copies of
# FILES with the image replaced and every Pod's CPU and memory requests cut
# to what this 2-core node has room for; --no-gpu also takes out
# nvidia.com/gpu (no GPUs, no GPU device plugin here).
workload_overlay() {
	local gpu=keep
	if [[ $1 == --no-gpu ]]; then
		gpu=remove
		shift
	fi
	local dir=$1 f p files=()
	shift
	mkdir -p "$dir/files"
	for f in "$@"; do
		cp "$f" "$dir/files/"
		files+=("files/$(basename "$f")")
	done
	{
		cat <<EOF
namespace: default
images:
  - name: nvcr.io/nvidia/pytorch
    newName: ${WORKLOAD_IMAGE%:*}
    newTag: "${WORKLOAD_IMAGE##*:}"
patches:
EOF
		for p in $(awk '/^kind: Pod$/ { pod = 1 } pod && /^  name: / { print $2; pod = 0 }' "$@"); do
			cat <<EOF
  - target: {kind: Pod, name: $p}
    patch: |-
EOF
			[[ $gpu == keep ]] || cat <<EOF
      - {op: remove, path: /spec/containers/0/resources/requests/nvidia.com~1gpu}
      - {op: remove, path: /spec/containers/0/resources/limits/nvidia.com~1gpu}
EOF
			cat <<EOF
      - {op: replace, path: /spec/containers/0/resources/requests/cpu, value: 100m}
      - {op: replace, path: /spec/containers/0/resources/requests/memory, value: 256Mi}
      - {op: replace, path: /spec/containers/0/resources/limits/memory, value: 256Mi}
EOF
		done
	} | write_overlay "$dir" "${files[@]}"
}

# test_examples applies deployments/examples/ through workload_overlay.
test_examples() {
	workload_overlay --no-gpu "$RUN/examples" "$REPO"/deployments/examples/*.yaml
	check "kubectl apply -k of deployments/examples/" kubectl apply -k "$RUN/examples"
	require "pod $EXAMPLE_POD Running" 180 pod_running default "$EXAMPLE_POD"
	require "pod $EXAMPLE8_POD Running" 180 pod_running default "$EXAMPLE8_POD"

	check_pod default "$EXAMPLE_POD" train sriov-rdma "$EXAMPLE_RANGE"
	expect "$EXAMPLE_POD: one VF" 1 "${#POD_VFS[@]}"
	expect "$EXAMPLE_POD: NCCL_IB_HCA from the device plugin" "=$(vf_field "${POD_VFS[0]}" rdmaDevice):1" \
		"$(pod_env "$POD_PID" NCCL_IB_HCA)"

	check_pod default "$EXAMPLE8_POD" train sriov-rdma "$EXAMPLE_RANGE"
	expect "$EXAMPLE8_POD: 8 VFs" 8 "${#POD_VFS[@]}"
	local vf pfs hcas
	pfs=$(for vf in "${POD_VFS[@]}"; do vf_field "$vf" pfAddress; done | sort -u | wc -l)
	expect "$EXAMPLE8_POD: its 8 VFs are on 8 PFs (spread)" 8 "$pfs"
	hcas=$(for vf in "${POD_VFS[@]}"; do echo "$(vf_field "$vf" rdmaDevice):1"; done | sort | paste -sd,)
	expect "$EXAMPLE8_POD: NCCL_IB_HCA names its 8 RDMA devices" "=$hcas" \
		"=$(pod_env "$POD_PID" NCCL_IB_HCA | sed 's/^=//' | tr ',' '\n' | sort | paste -sd,)"
}

# ------------------------------------------------------------ node events

# test_link_down takes a PF stand-in down: its VFs must leave the node's
# allocatable within a second (plus the kubelet's 1s node status period).
test_link_down() {
	local pf pfaddr n t0 dt
	pf=$(head -n1 "$RUN/pf-standins")
	pfaddr=$(jq -r --arg n "$pf" '.devices[] | select(.netdev == $n and .pfAddress == "") | .pciAddress' "$RUN/discover.json")
	n=$(jq --arg r "$RESOURCE" --arg p "$pfaddr" '[.pools[] | select(.resource == $r) | .devices[]] as $pool
		| [.devices[] | select(.pfAddress == $p) | .pciAddress | select(. as $a | $pool | index($a))] | length' "$RUN/discover.json")
	local want=$((WANT_VFS - n))
	t0=$(date +%s.%N)
	ip link set "$pf" down
	if wait_for 10 "allocatable $RESOURCE = $want after $pf down" allocatable_is "$RESOURCE" "$want"; then
		dt=$(elapsed "$t0")
		check "PF $pf down: its $n VFs left the node's allocatable in ${dt}s (want <= 2s)" \
			awk -v d="$dt" 'BEGIN { exit !(d <= 2) }'
	else
		fail "PF $pf down: allocatable stayed $(allocatable "$RESOURCE") (want $want within 10s)"
	fi
	ip link set "$pf" up
	check "PF $pf up: allocatable back to $WANT_VFS" wait_for 15 "allocatable back" allocatable_is "$RESOURCE" "$WANT_VFS"
}

# pods_state prints each running pod's VFs and app PID, to compare across
# restarts.
pods_state() {
	local p
	for p in "$SEED_POD:nccl" "$EXAMPLE_POD:train" "$EXAMPLE8_POD:train"; do
		echo "${p%%:*} pid=$(task_pid default "${p%%:*}" "${p##*:}") vfs=$(pod_vfs "default/${p%%:*}" | paste -sd,)"
	done
}

# same_pods FILE succeeds when pods_state is what FILE holds.
same_pods() { [[ $(pods_state) == "$(<"$1")" ]]; }

# check_pods_kept EVENT BEFORE checks that the running pods keep their
# containers and VFs across EVENT: pods_state is BEFORE again (waited for,
# bounded), and a difference is named.
check_pods_kept() {
	local file=$RUN/pods-before-${1// /-}
	echo "$2" >"$file"
	check "running pods keep their containers and VFs across the $1" \
		wait_for 30 "same pods, PIDs and VFs" same_pods "$file"
	same_pods "$file" || same "pods across the $1 (+ now, - before)" "$file" pods_state
}

# test_plugin_restart kills the plugin's container: the kubelet restarts
# it, it registers again, and the running pods keep their VFs.
test_plugin_restart() {
	local pid before restarts
	before=$(pods_state)
	restarts=$(restart_count)
	pid=$(task_pid "$DS_NS" "$(kubectl -n "$DS_NS" get pods -l "app.kubernetes.io/name=$DS" -o jsonpath='{.items[0].metadata.name}')" "$DS")
	kill -KILL "$pid"
	require "plugin container (pid $pid) killed: restarted by the kubelet" 60 restarted "$restarts"
	require "DaemonSet Ready again" 120 ds_ready
	# A new process: its counter starts at 0.
	check "restarted plugin registered with the kubelet" wait_for 30 "registered" registrations_above 0
	check "allocatable $RESOURCE = $WANT_VFS after the plugin restart" wait_for 30 "allocatable" allocatable_is "$RESOURCE" "$WANT_VFS"
	check_pods_kept "plugin restart" "$before"
}

# test_kubelet_restart restarts the kubelet: the plugin sees the new
# kubelet.sock and registers again; pods keep their containers and VFs.
test_kubelet_restart() {
	local before regs
	before=$(pods_state)
	regs=$(registrations)
	stop kubelet
	start_kubelet " (after restart)"
	check "device plugin registered again after the kubelet restart" wait_for 60 "registered again" registrations_above "$regs"
	check "allocatable $RESOURCE = $WANT_VFS after the kubelet restart" wait_for 60 "allocatable" allocatable_is "$RESOURCE" "$WANT_VFS"
	check_pods_kept "kubelet restart" "$before"
}

# ------------------------------------------------------------ clean-up

standins_home() {
	local name mac
	while read -r _ name _ mac; do
		[[ $(cat "/sys/class/net/$name/address" 2>/dev/null) == "$mac" ]] || return 1
	done <"$RUN/standins.mac"
}
no_workload_pods() { [[ -z $(kubectl -n default get pods -o name) ]]; }
empty_dir() { [[ -z $(ls -A "$1" 2>/dev/null) ]]; }
# no_state: the sriov CNI's state dir holds no attachment: its tombstones
# (deleted-*.json, a DEL that found nothing; they refuse a late ADD of that
# attachment for 10 minutes, docs/cni.md) are no state.
no_state() { [[ -z $(ls -A "$1" 2>/dev/null | grep -v '^deleted-.*\.json$') ]]; }
no_files() { [[ -z $(find "$1" -type f 2>/dev/null) ]]; }

# test_delete deletes the pods, then the deployment: every VF stand-in is
# back on the host under its name with its MAC, the IP pools are empty, no
# CNI state is left.
test_delete() {
	kubectl delete -k "$RUN/examples" --wait=false >/dev/null
	kubectl delete pod "$SEED_POD" --wait=false >/dev/null
	require "training pods deleted" 120 no_workload_pods
	check "all $WANT_VFS stand-ins back on the host under their names and MACs" wait_for 30 "stand-ins back" standins_home
	expect "whereabouts IPPool $SEED_RANGE empty" "" "$(ippool_pods "$SEED_RANGE" | xargs)"
	expect "whereabouts IPPool $EXAMPLE_RANGE empty" "" "$(ippool_pods "$EXAMPLE_RANGE" | xargs)"
	check "sriov CNI state dir $SRIOV_STATE empty" no_state "$SRIOV_STATE"
	check "Multus cache holds no file" no_files "$RUN/cni/multus"
	expect "PodResources lists no pod of default" "" "$(podres list | grep '^default/' || true)"
	kubectl delete -k "$RUN/seed" --ignore-not-found >/dev/null
	check "kubectl delete -k of the deployment" kubectl delete -k "$RUN/deploy" --timeout 120s
	# The plugin removes the device-info files it wrote when it stops (it
	# cannot tell when a pod is gone: the device plugin API has no release).
	wait_for 30 "devinfo dir empty" empty_dir "$DEVINFO_DIR" || true
	expect "device plugin stopped: its device-info files removed (left in $DEVINFO_DIR)" "" \
		"$(ls -A "$DEVINFO_DIR" 2>/dev/null | xargs)"
}
