# shellcheck shell=bash
# The DRA phase of make e2e-cluster (sourced by run.sh, run after the device
# plugin's checks): the same DaemonSet with deployments/components/dra, the
# VF pool served through DRA; a stand-in GPU DRA driver publishing the
# fixture host's GPUs; the shipped example claims (a GPU and a VF on one
# PCIe root) scheduled by the real scheduler, prepared through CDI in
# containerd, the VF attached by Multus through the sriov CNI; a claim
# whose constraint cannot be met; the plugin killed with prepared claims;
# deleting the pods unprepares and restores.

DRA_DRIVER=rdma.fastpath-k8s.io
GPU_DRIVER=gpu.e2e.fastpath-k8s.io
GPU_CLASS=gpu.nvidia.com # the class the shipped examples ask for
VF_CLASS=mlnx-sriov-rdma.fastpath-k8s.io # deployments/components/dra/deviceclass.yaml
CDI_DIR=/var/run/cdi
DRA_PLUGIN_DIR=$K/plugins/$DRA_DRIVER
DRA_EXAMPLES=$REPO/deployments/components/dra/examples
TEMPLATE_POD=nccl-train-aligned
MULTUS_POD=nccl-train-rank-0
MULTUS_CLAIM=rank-0-gpu-vf
MULTUS_NAD=rank-0-rail
STUCK_POD=nccl-unalignable
STUCK_CLAIM=unalignable
# Where a container finds its claims' device metadata (KEP-5304, written by
# the driver's kubelet-plugin helper, bind-mounted through its own CDI
# spec), and where the helper keeps the files on the node.
META_DIR=/var/run/kubernetes.io/dra-device-attributes
META_HOST_DIR=$DRA_PLUGIN_DIR/dra-device-metadata

# ------------------------------------------------------------ helpers

# node_slices DRIVER prints the node's ResourceSlices of DRIVER, one JSON
# a line; it fails when the API server does not answer (an unanswered list
# is not an empty one).
node_slices() {
	local json
	json=$(kubectl get resourceslices -o json) || return 1
	jq -c --arg d "$1" --arg n "$NODE" '.items[] | select(.spec.driver == $d and .spec.nodeName == $n)' <<<"$json"
}
# slice_devices DRIVER prints the node's published devices of DRIVER as JSON
# lines {name, attrs, taints}; attribute values flattened to strings.
slice_devices() {
	node_slices "$1" | jq -c '.spec.devices[]?
		| {name, taints: ([.taints[]?.value] | join(",")),
		   attrs: ((.attributes // {}) | with_entries(.value |= (.string // .int // .bool | tostring)))}'
}
device_count() { slice_devices "$1" | wc -l; }
count_is() { [[ $(device_count "$1") == "$2" ]]; }
# dev_attr DRIVER DEVICE ATTR prints one attribute of a published device.
dev_attr() { slice_devices "$1" | jq -r --arg n "$2" --arg a "$3" 'select(.name == $n) | .attrs[$a] // ""'; }
# vf_of_device DEVICE prints the PCI address of our published device.
vf_of_device() { dev_attr "$DRA_DRIVER" "$1" k8s.cni.cncf.io/deviceID; }
# claim_device NS CLAIM DRIVER prints the device a claim got from DRIVER.
claim_device() {
	kubectl -n "$1" get resourceclaim "$2" -o json |
		jq -r --arg d "$3" '[.status.allocation.devices.results[]? | select(.driver == $d) | .device] | join(",")'
}
# claim_network_data NS CLAIM DEVICE IFNAME ADDR MAC: the claim's status
# has our DEVICE's entry with that network data, the only one of our driver.
claim_network_data() {
	kubectl -n "$1" get resourceclaim "$2" -o json | jq_true --arg d "$DRA_DRIVER" --arg n "$3" --arg i "$4" --arg a "$5" --arg m "$6" \
		'[.status.devices[]? | select(.driver == $d) | {device, networkData}] == [{device: $n, networkData: {interfaceName: $i, ips: [$a], hardwareAddress: $m}}]'
}
# claim_unallocated NS CLAIM: the claim exists and has no allocation.
claim_unallocated() { kubectl -n "$1" get resourceclaim "$2" -o json | jq_true '.status.allocation == null'; }
# pod_claim NS POD prints the name of the ResourceClaim made for the pod's first claim.
pod_claim() { kubectl -n "$1" get pod "$2" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}'; }
claim_uid() { kubectl -n "$1" get resourceclaim "$2" -o jsonpath='{.metadata.uid}'; }
gpu_addr() { local a=${1#gpu-}; echo "${a:0:4}:${a:5:2}:${a:8:2}.${a:11:1}"; }
gpu_device() { local a=${1//:/-}; echo "gpu-${a//./-}"; }
# allocated_gpus prints the stand-in's devices that claims hold, one a line.
allocated_gpus() {
	kubectl get resourceclaims -A -o json |
		jq -r --arg d "$GPU_DRIVER" '.items[].status.allocation.devices.results[]? | select(.driver == $d) | .device'
}
tainted_count() { slice_devices "$DRA_DRIVER" | jq -s --arg p "$1" '[.[] | select(.attrs.pfPciAddress == $p and .taints != "")] | length'; }
published_count() { slice_devices "$DRA_DRIVER" | jq -s --arg p "$1" '[.[] | select(.attrs.pfPciAddress == $p)] | length'; }
# rail_vfs PF prints how many of the pool's VFs the PF has (discover).
rail_vfs() {
	jq --arg r "$RESOURCE" --arg p "$1" '[.pools[] | select(.resource == $r) | .devices[]] as $pool
		| [.devices[] | select(.pfAddress == $p) | .pciAddress | select(. as $a | $pool | index($a))] | length' "$RUN/discover.json"
}
# rail_unusable PF: its VFs are tainted or (without DRADeviceTaints) unpublished.
rail_unusable() { (($(tainted_count "$1") == $(rail_vfs "$1") || $(published_count "$1") == 0)); }
rail_usable() { (($(tainted_count "$1") == 0 && $(published_count "$1") == $(rail_vfs "$1"))); }
our_cdi_specs() { find "$CDI_DIR" -maxdepth 1 -name "$DRA_DRIVER-vf_*.json" -printf '%f\n' 2>/dev/null | sort; }
gpu_cdi_specs() { find "$CDI_DIR" -maxdepth 1 -name "$GPU_DRIVER-gpu_*.json" -printf '%f\n' 2>/dev/null | sort; }
checkpoint_claims() { jq '.claims | length' "$DRA_PLUGIN_DIR/checkpoint.json" 2>/dev/null || echo missing; }
checkpoint_is() { [[ $(checkpoint_claims) == "$1" ]]; }
no_cdi_specs() { [[ -z $("$1") ]]; }
# no_path PATH: PATH (a socket, a file) is gone.
no_path() { [[ ! -e $1 ]]; }
# no_slices DRIVER: the API server answers and lists no ResourceSlice of
# DRIVER for the node.
no_slices() {
	local slices
	slices=$(node_slices "$1") || return 1
	[[ -z $slices ]]
}
pod_pending_unschedulable() {
	[[ $(pod_phase "$1" "$2") == Pending ]] &&
		kubectl -n "$1" get pod "$2" -o json | jq_true 'any(.status.conditions[]?; .type == "PodScheduled" and .status == "False" and .reason == "Unschedulable")'
}
plugin_log_has() { plugin_log | grep -qF "$1"; }
no_dra_pods() { [[ -z $(kubectl -n default get pods -o name) ]]; }

# dra_require is require that, when the wait fails, first writes the DRA
# objects' state, the events and the plugin's log to $RUN/logs/dra-state.log
# (dra_dump).
dra_require() { REQUIRE_DUMP=dra_dump require "$@"; }
dra_dump() {
	{
		kubectl get resourceslices -o wide
		kubectl get resourceclaims -A -o yaml
		plugin_log | tail -n 30
		kubectl get events -A --sort-by=.lastTimestamp | tail -n 30
		kubectl get pods,resourceclaims -A -o wide
	} >"$RUN/logs/dra-state.log" 2>&1
	echo "state in $RUN/logs/dra-state.log"
}

# check_aligned WHAT GPU VFDEV: the GPU and the VF a claim got are
# published with one pcieRoot.
check_aligned() {
	local g v
	g=$(dev_attr "$GPU_DRIVER" "$2" resource.kubernetes.io/pcieRoot)
	v=$(dev_attr "$DRA_DRIVER" "$3" resource.kubernetes.io/pcieRoot)
	check "$1: the VF ($3) is under the GPU's ($2) PCIe root ($g, $v)" test -n "$g" -a "$g" = "$v"
}
# dra_pods prints the DRA phase's pods with their containers' host PIDs.
dra_pods() {
	local p
	for p in "$TEMPLATE_POD" "$MULTUS_POD" "$STUCK_POD"; do printf '%s=%s ' "$p" "$(task_pid default "$p" train)"; done
}
# claim_released NS CLAIM: allocated to nothing, reserved for no pod.
claim_released() {
	kubectl -n "$1" get resourceclaim "$2" -o json | jq_true '.status.allocation == null and (.status.reservedFor // [] | length) == 0'
}
claim_gone() { ! kubectl -n "$1" get resourceclaim "$2" >/dev/null 2>&1; }

# dra_check_pod NS POD CONTAINER VF [NAD RANGE [NO_DEVINFO_WHY]]: what the pod got for its
# VF through its claim: exactly the VF's char devices and its env (CDI);
# with a NAD, the VF's stand-in as net<N> with a whereabouts address and
# the network-status device-info of the VF (Multus through the sriov CNI).
dra_check_pod() {
	local ns=$1 pod=$2 ctr_name=$3 vf=$4 nad=${5:-} range=${6:-} pid want_devs got_devs rdma
	pid=$(task_pid "$ns" "$pod" "$ctr_name")
	want_devs=$(vf_field "$vf" 'charDevices[]' | xargs -n1 basename | sort -u | xargs)
	got_devs=$(find "/proc/$pid/root/dev/infiniband" -mindepth 1 -printf '%f\n' 2>/dev/null | sort | xargs)
	expect "$pod: /dev/infiniband holds exactly its VF's char devices (CDI)" "$want_devs" "$got_devs"
	expect "$pod: $RESOURCE_ENV names its VF (CDI)" "$vf" "$(pod_env "$pid" "$RESOURCE_ENV")"
	rdma=$(vf_field "$vf" rdmaDevice)
	expect "$pod: NCCL_IB_HCA names its VF's RDMA device (CDI)" "=$rdma:1" "$(pod_env "$pid" NCCL_IB_HCA)"
	expect "$pod: UCX_NET_DEVICES (CDI)" "$rdma:1" "$(pod_env "$pid" UCX_NET_DEVICES)"
	[[ -n $nad ]] || return 0
	check_vf_in_pod "$pod" "$pid" "$vf" "$range"
	local ifname=$VF_IFNAME status
	status=$(kubectl -n "$ns" get pod "$pod" -o json | jq -r '.metadata.annotations["k8s.v1.cni.cncf.io/network-status"] // "[]"')
	if [[ -n ${7:-} ]]; then
		check "$pod: network-status has $ns/$nad on $ifname ($7)" \
			jq_true --arg i "$ifname" --arg n "$ns/$nad" 'any(.[]; .interface == $i and .name == $n)' <<<"$status"
		return 0
	fi
	check "$pod: network-status has $ns/$nad on $ifname with device-info pci-address $vf" \
		jq_true --arg i "$ifname" --arg n "$ns/$nad" --arg a "$vf" \
		'any(.[]; .interface == $i and .name == $n and .["device-info"].pci["pci-address"] == $a)' <<<"$status"
}

# in_container NS POD CONTAINER CMD...: runs CMD in the container, a
# process of its own spec (mounts, user) through containerd, as kubectl
# exec would (this kubelet serves no exec).
in_container() {
	local id
	id=$(task_id "$1" "$2" "$3") || return 1
	ctr tasks exec --exec-id "e2e-$RANDOM" "$id" "${@:4}"
}
our_meta_specs() { find "$CDI_DIR" -maxdepth 1 -name "${DRA_DRIVER}_metadata_*.json" -printf '%f\n' 2>/dev/null | sort; }
no_paths() {
	local p
	for p; do [[ ! -e $p ]] || return 1; done
}
no_metadata_left() { no_cdi_specs our_meta_specs && empty_dir "$META_HOST_DIR"; }

# check_metadata NS POD CONTAINER CLAIM_DIR REQUEST VF: the container
# reads its VF's device metadata at the path KEP-5304 gives it,
# $META_DIR/CLAIM_DIR/REQUEST/$DRA_DRIVER-metadata.json (CLAIM_DIR is
# resourceclaims/<claim> or resourceclaimtemplates/<the pod's claim
# name>): metadata.resource.k8s.io/v1beta1, the VF's pciBusID, RDMA device,
# uverbs (a device node the container has) and host netdev; with NAD (a
# 7th argument: the pod's VF attached by Multus), its networkData too.
check_metadata() {
	local ns=$1 pod=$2 ctr_name=$3 file="$META_DIR/$4/$5/$DRA_DRIVER-metadata.json" vf=$6 log got dev
	log="$RUN/logs/metadata-$pod.json"
	# A missing or unreadable file is a failed check below, not the end of the run.
	in_container "$ns" "$pod" "$ctr_name" cat "$file" >"$log" 2>&1 || true
	got=$(jq -c -s --arg d "$DRA_DRIVER" '.[0] | {v: .apiVersion, d: [.requests[].devices[] | select(.driver == $d) | .attributes
		| {bus: .["resource.kubernetes.io/pciBusID"].string, rdma: .rdmaDevice.string, uverbs: .uverbs.string, netdev: .netdev.string}]}' "$log" 2>/dev/null) ||
		got="unreadable: $(head -c 200 "$log" | tr '\n' ' ')"
	expect "$pod: $file in the container, with its VF" \
		"$(jq -c -n --arg a "$vf" --arg r "$(vf_field "$vf" rdmaDevice)" --arg u "$(vf_field "$vf" 'charDevices[]' | grep /uverbs)" --arg n "$(vf_field "$vf" netdev)" \
			'{v: "metadata.resource.k8s.io/v1beta1", d: [{bus: $a, rdma: $r, uverbs: $u, netdev: $n}]}')" "$got"
	dev=$(jq -r '.d[0].uverbs // ""' <<<"$got" 2>/dev/null) || dev=
	check "$pod: the metadata's uverbs '$dev' is a device node in the container" in_container "$ns" "$pod" "$ctr_name" test -c "$dev"
	[[ -n ${7:-} ]] && check_network_data "$ns" "$pod" "$7" "$vf" "$log"
	return 0
}

# check_network_data NS POD NAD VF LOG: the metadata file the container
# read (LOG) has the VF's networkData, which the sriov CNI told the driver
# after its ADD and before the container was created: the interface
# check_vf_in_pod found in the pod (VF_IFNAME, VF_ADDR), the stand-in's
# MAC, and the addresses the pod's network-status gives the NAD's entry.
check_network_data() {
	local ns=$1 pod=$2 nad=$3 vf=$4 log=$5 got status
	got=$(jq -c -s --arg d "$DRA_DRIVER" '[.[0].requests[].devices[] | select(.driver == $d) | .networkData // {}][0]' "$log" 2>/dev/null) || got=unreadable
	expect "$pod: its metadata's networkData is its VF's interface in the pod" \
		"$(jq -c -n --arg i "$VF_IFNAME" --arg a "$VF_ADDR" --arg m "$(mac_of "$vf")" '{interfaceName: $i, ips: [$a], hardwareAddress: $m}')" \
		"$(jq -c '{interfaceName, ips, hardwareAddress}' <<<"$got" 2>/dev/null)"
	status=$(kubectl -n "$ns" get pod "$pod" -o json | jq -r '.metadata.annotations["k8s.v1.cni.cncf.io/network-status"] // "[]"')
	expect "$pod: networkData's addresses are network-status's for $ns/$nad" \
		"$(jq -c --arg n "$ns/$nad" --arg i "$VF_IFNAME" '[.[] | select(.name == $n and .interface == $i) | .ips[]?]' <<<"$status")" \
		"$(jq -c '[.ips[]? | sub("/[0-9]+$"; "")]' <<<"$got" 2>/dev/null)"
}

# ------------------------------------------------------------ the phase

test_dra() {
	dra_deploy
	dra_gpu_standin
	dra_template_pod
	dra_multus_pod
	dra_seed_pod
	dra_numa_pod
	dra_unsatisfiable
	dra_plugin_restart
	dra_kubelet_restart # dra-restart.sh
	dra_reboot
	dra_delete
	dra_node_deleted
}

# api_overlay DIR makes DIR a copy of the device plugin's overlay
# ($RUN/deploy) in which the plugin talks to the API server. This cluster
# has no kube-proxy: the kubernetes Service's address, which in-cluster
# clients dial, leads nowhere. The plugin (on the host network) reaches the
# API server where it listens, as a node's own components do — the one
# change the plugin's API clients (DRA, provisioning's node labels) need
# here. Patches may be appended to DIR/kustomization.yaml after it.
api_overlay() {
	mkdir -p "$1"
	cp "$RUN/deploy/kustomization.yaml" "$1/"
	cat >>"$1/kustomization.yaml" <<EOF
  - target: {kind: DaemonSet, name: $DS}
    patch: |-
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_HOST, value: "$API_HOST"}}
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}}
EOF
}

# dra_deploy applies the device plugin's overlay (image, fixture host root)
# with the DRA component on top, as a user turns it on.
dra_deploy() {
	api_overlay "$RUN/deploy-dra"
	echo "components: [$(realpath --relative-to="$RUN/deploy-dra" "$REPO/deployments/components/dra")]" >>"$RUN/deploy-dra/kustomization.yaml"
	kubectl kustomize "$RUN/deploy-dra" >"$RUN/deploy-dra.yaml"
	check "kubectl kustomize with components/dra runs /usr/bin/rdma-device-plugin-dra" \
		grep -q 'rdma-device-plugin-dra' "$RUN/deploy-dra.yaml"
	check "kubectl apply -k of the overlay with components/dra" kubectl apply -k "$RUN/deploy-dra"
	require "DaemonSet $DS_NS/$DS (DRA build) Ready on $NODE" 180 ds_ready
	require "ResourceSlices of $DRA_DRIVER list the $WANT_VFS VFs" 60 count_is "$DRA_DRIVER" "$WANT_VFS"
	require "node allocatable $SHARED_RESOURCE = $WANT_SHARED (the shared pool stays the device plugin's)" 30 \
		allocatable_is "$SHARED_RESOURCE" "$WANT_SHARED"
	check "node allocatable has no $RESOURCE: the VF pool is served by DRA only" wait_for 30 "no $RESOURCE" allocatable_is "$RESOURCE" 0
	# Every VF of the pool, published with the attributes discover finds
	# for it (the standard ones and fastpath's), and nothing else.
	local want got
	want=$(jq -S -c --arg r "$RESOURCE" '[.pools[] | select(.resource == $r) | .devices[]] as $pool
		| [.devices[] | select(.pciAddress as $a | $pool | index($a)) | {name: (.pciAddress | gsub("[:.]"; "-")), attrs: {
			"resource.kubernetes.io/pcieRoot": .pcieRoot, "resource.kubernetes.io/pciBusID": .pciAddress,
			"resource.kubernetes.io/numaNode": (.numaNode | tostring),
			"k8s.cni.cncf.io/deviceID": .pciAddress, "k8s.cni.cncf.io/resourceName": $r,
			linkType, rdmaDevice, netdev, pfNetdev, driver, pfPciAddress: .pfAddress, vfIndex: (.vfIndex | tostring)}
			| with_entries(select(.value != "" and .value != "-1"))}]
		| sort_by(.name) | .[]' "$RUN/discover.json")
	got=$(slice_devices "$DRA_DRIVER" | jq -s -S -c 'map({name, attrs}) | sort_by(.name) | .[]')
	check "ResourceSlices: each of the $WANT_VFS VFs with discover's pcieRoot, pciBusID, numaNode, deviceID, resourceName, linkType, rdmaDevice, netdev, PF, vfIndex, driver" \
		test "$got" = "$want"
	[[ $got == "$want" ]] || diff <(echo "$want") <(echo "$got") >&2 || true
	# The admission policy: the plugin's account, with a token bound to its
	# pod (so naming its node), may not write another node's slice.
	local pod token
	pod=$(kubectl -n "$DS_NS" get pods -l "app.kubernetes.io/name=$DS" -o jsonpath='{.items[0].metadata.name}')
	token=$(kubectl -n "$DS_NS" create token "$DS" --bound-object-kind Pod --bound-object-name "$pod" --duration 10m)
	kubeconfig dra-plugin "token:$token"
	if "$WORK/bin/kubectl" --kubeconfig "$KCFG/dra-plugin.kubeconfig" create -f - >"$RUN/logs/vap.log" 2>&1 <<EOF; then
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: e2e-other-node}
spec: {driver: $DRA_DRIVER, nodeName: other-node, pool: {name: other-node, generation: 1, resourceSliceCount: 1}}
EOF
		fail "the plugin's account wrote a ResourceSlice of another node"
		kubectl delete resourceslice e2e-other-node >/dev/null 2>&1
	else
		check "the plugin's account may not write another node's ResourceSlice ($(tail -c 160 "$RUN/logs/vap.log" | tr '\n' ' '))" \
			grep -q "may only manage that node's ResourceSlices" "$RUN/logs/vap.log"
	fi
}

# dra_gpu_standin runs the stand-in GPU DRA driver on the node (as the
# kubelet runs: a host process) and the GPU DeviceClass the examples name.
dra_gpu_standin() {
	start gpu-standin "$WORK/bin/gpu-standin" --host-root "$HOST" --kubeconfig "$KCFG/admin.kubeconfig" --node-name "$NODE"
	kubectl apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: $GPU_CLASS}
spec:
  selectors:
    - cel: {expression: 'device.driver == "$GPU_DRIVER"'}
EOF
	require "ResourceSlices of $GPU_DRIVER list the fixture's 8 GPUs" 60 count_is "$GPU_DRIVER" 8
}

# dra_template_pod: the shipped ResourceClaimTemplate (a GPU and a VF with
# matchAttribute pcieRoot) and its pod. The scheduler allocates; the pod
# gets the VF's char devices and env, and the GPU's, through CDI.
dra_template_pod() {
	workload_overlay "$RUN/dra-template" "$DRA_EXAMPLES/gpu-vf-template.yaml"
	check "kubectl apply -k of the GPU+VF claim template and its pod" kubectl apply -k "$RUN/dra-template"
	dra_require "pod $TEMPLATE_POD Running" 180 pod_running default "$TEMPLATE_POD"
	local claim gpu vfdev vf pid
	claim=$(pod_claim default "$TEMPLATE_POD")
	gpu=$(claim_device default "$claim" "$GPU_DRIVER")
	vfdev=$(claim_device default "$claim" "$DRA_DRIVER")
	vf=$(vf_of_device "$vfdev")
	TEMPLATE_VF=$vf
	TEMPLATE_CLAIM=$claim
	expect "$TEMPLATE_POD placed by the default scheduler" default-scheduler \
		"$(kubectl -n default get events --field-selector "involvedObject.name=$TEMPLATE_POD,reason=Scheduled" -o json | jq -r '[.items[] | .reportingComponent // .source.component] | unique | join(",")')"
	check "claim $claim: a GPU ($gpu) and a VF ($vf)" test -n "$gpu" -a -n "$vf"
	check_aligned "claim $claim" "$gpu" "$vfdev"
	dra_check_pod default "$TEMPLATE_POD" train "$vf"
	pid=$(task_pid default "$TEMPLATE_POD" train)
	expect "$TEMPLATE_POD: the GPU's env (the stand-in's CDI spec)" "$(gpu_addr "$gpu")" "$(pod_env "$pid" E2E_GPU_PCI_BUS_ID)"
	check "$TEMPLATE_POD: its claim's CDI spec is in $CDI_DIR" test -f "$CDI_DIR/$DRA_DRIVER-vf_$(claim_uid default "$claim").json"
	check "$TEMPLATE_POD: a device-info file for its VF under the claim's name" test -f "$DEVINFO_DIR/$claim-$vf-device.json"
	check_metadata default "$TEMPLATE_POD" train resourceclaimtemplates/gpu-vf vf "$vf"
}

# dra_multus_pod: the shipped ResourceClaim + NAD + pod: Multus v4.3.0
# finds the VF's PCI address in the claim's CDI names and hands it to the
# sriov CNI, unchanged, as deviceID.
dra_multus_pod() {
	workload_overlay "$RUN/dra-multus" "$DRA_EXAMPLES/gpu-vf-multus.yaml"
	check "kubectl apply -k of the GPU+VF claim, its NAD and pod" kubectl apply -k "$RUN/dra-multus"
	dra_require "pod $MULTUS_POD Running" 180 pod_running default "$MULTUS_POD"
	local gpu vfdev vf
	gpu=$(claim_device default "$MULTUS_CLAIM" "$GPU_DRIVER")
	vfdev=$(claim_device default "$MULTUS_CLAIM" "$DRA_DRIVER")
	vf=$(vf_of_device "$vfdev")
	check_aligned "claim $MULTUS_CLAIM" "$gpu" "$vfdev"
	check "claim $MULTUS_CLAIM: a VF ($vf), not the template pod's ($TEMPLATE_VF)" test -n "$vf" -a "$vf" != "$TEMPLATE_VF"
	dra_check_pod default "$MULTUS_POD" train "$vf" "$MULTUS_NAD" "$EXAMPLE_RANGE"
	check "the driver's socket for the CNI, $DRA_PLUGIN_DIR/cni.sock, is root's only (0600)" \
		test "$(stat -c %F:%a "$DRA_PLUGIN_DIR/cni.sock" 2>/dev/null)" = socket:600
	check_metadata default "$MULTUS_POD" train "resourceclaims/$MULTUS_CLAIM" vf "$vf" "$MULTUS_NAD"
	MULTUS_VF=$vf MULTUS_IFNAME=$VF_IFNAME MULTUS_ADDR=$VF_ADDR
	check "API server: DRAResourceClaimDeviceStatus on (GA in v1.37, no gate to set)" feature_enabled /metrics DRAResourceClaimDeviceStatus
	check "API server: DRAResourceClaimGranularStatusAuthorization on (beta in v1.37, on by default)" \
		feature_enabled /metrics DRAResourceClaimGranularStatusAuthorization
	check "claim $MULTUS_CLAIM: status.devices has $vfdev's networkData ($VF_IFNAME, $VF_ADDR), applied by the driver (KEP-4817)" \
		wait_for 30 "claim status networkData" claim_network_data default "$MULTUS_CLAIM" "$vfdev" "$VF_IFNAME" "$VF_ADDR" "$(mac_of "$vf")"
	expect "whereabouts IPPool $EXAMPLE_RANGE holds the pod" "default/$MULTUS_POD" "$(ippool_pods "$EXAMPLE_RANGE" | xargs)"
}

# feature_enabled COMPONENT_URL GATE: the component's /metrics says GATE is on.
feature_enabled() {
	local m
	m=$(kubectl get --raw "$1") || return 1
	grep '^kubernetes_feature_enabled' <<<"$m" >"$RUN/logs/feature-gates.txt"
	grep -qE "^kubernetes_feature_enabled\{name=\"$2\",stage=\"[A-Z]*\"\} 1\$" <<<"$m"
}
# extended_claim NS POD prints the claim the scheduler made for the pod's
# resources.limits of a DRA-backed extended resource.
extended_claim() { kubectl -n "$1" get pod "$2" -o jsonpath='{.status.extendedResourceClaimStatus.resourceClaimName}'; }

# dra_seed_pod: the seed's NAD and training pod, unchanged (resources.limits
# mellanox.com/mlnx_sriov_rdma: 1), now that DRA serves the VF pool: the
# scheduler turns the limit into a claim of the shipped DeviceClass
# (extendedResourceName, KEP-5004), CDI gives the VF's devices and env,
# Multus and the sriov CNI attach it (the CNI finds the pod's DRA VF in
# PodResources: Multus passes no deviceID for a generated claim name).
dra_seed_pod() {
	check "API server: DRAExtendedResource on (GA in v1.37, no gate to set)" feature_enabled /metrics DRAExtendedResource
	check "kubectl apply -k of the seed's NAD and pod, unchanged" kubectl apply -k "$RUN/seed"
	dra_require "pod $SEED_POD Running through DRA" 180 pod_running default "$SEED_POD"
	local claim vfdev vf
	claim=$(extended_claim default "$SEED_POD")
	vfdev=$(claim_device default "$claim" "$DRA_DRIVER")
	vf=$(vf_of_device "$vfdev")
	check "$SEED_POD: the scheduler made claim '$claim' for its $RESOURCE limit, with a VF ($vf) of $DRA_DRIVER" test -n "$claim" -a -n "$vf"
	check "node allocatable still has no $RESOURCE (served by DRA only)" allocatable_is "$RESOURCE" 0
	dra_check_pod default "$SEED_POD" nccl "$vf" sriov-net-ib "$SEED_RANGE" \
		"no device-info: Multus v4.3.0 asks for it only with a deviceID, which it has only for a claim the NAD names"
	expect "whereabouts IPPool $SEED_RANGE holds the pod" "default/$SEED_POD" "$(ippool_pods "$SEED_RANGE" | xargs)"
	# The scheduler's claim is named by the API server and its one request
	# by the scheduler (container-<i>-request-<j>): the file is found as
	# the pod's status names them.
	local req
	req=$(kubectl -n default get pod "$SEED_POD" -o json | jq -r '.status.extendedResourceClaimStatus.requestMappings[0].requestName // ""')
	check_metadata default "$SEED_POD" nccl "resourceclaims/$claim" "$req" "$vf" sriov-net-ib
	check "$SEED_POD: its metadata file on the node ($META_HOST_DIR/default_$claim) and its CDI spec" \
		test -f "$META_HOST_DIR/default_$claim/$req/metadata.json" -a -f "$CDI_DIR/${DRA_DRIVER}_metadata_$(claim_uid default "$claim")_$req.json"
	local meta_spec="$CDI_DIR/${DRA_DRIVER}_metadata_$(claim_uid default "$claim")_$req.json"
	kubectl -n default delete pod "$SEED_POD" --grace-period 1 >/dev/null
	dra_require "seed pod deleted" 120 claim_gone default "$claim"
	check "seed's claim unprepared: its CDI spec gone" wait_for 30 "seed spec removed" test "$(our_cdi_specs | wc -l)" = 2
	check "seed's claim unprepared: its metadata file and metadata CDI spec gone" \
		wait_for 30 "seed metadata removed" no_paths "$META_HOST_DIR/default_$claim" "$meta_spec"
	expect "whereabouts IPPool $SEED_RANGE empty" "" "$(ippool_pods "$SEED_RANGE" | xargs)"
	kubectl delete -k "$RUN/seed" --ignore-not-found >/dev/null
}

# dra_numa_pod: the shipped template for a GPU and a VF on one NUMA node
# (examples/alignment/gpu-numa-vf.yaml), through the real scheduler.
dra_numa_pod() {
	local pod=nccl-numa claim gpu vfdev g v
	check "kubectl apply of the GPU + NUMA VF claim template" kubectl -n default apply -f "$DRA_EXAMPLES/alignment/gpu-numa-vf.yaml"
	kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $pod, namespace: default}
spec:
  restartPolicy: Never
  resourceClaims: [{name: gpu-vf, resourceClaimTemplateName: gpu-with-numa-vf}]
  containers:
    - name: train
      image: $WORKLOAD_IMAGE
      command: ["sleep", "3600"]
      resources: {claims: [{name: gpu-vf}]}
EOF
	dra_require "pod $pod Running" 120 pod_running default "$pod"
	claim=$(pod_claim default "$pod")
	gpu=$(claim_device default "$claim" "$GPU_DRIVER")
	vfdev=$(claim_device default "$claim" "$DRA_DRIVER")
	g=$(dev_attr "$GPU_DRIVER" "$gpu" resource.kubernetes.io/numaNode)
	v=$(dev_attr "$DRA_DRIVER" "$vfdev" resource.kubernetes.io/numaNode)
	check "claim $claim (template gpu-with-numa-vf): GPU $gpu and VF $vfdev on one NUMA node ($g, $v)" test -n "$g" -a "$g" = "$v"
	kubectl -n default delete pod "$pod" --grace-period 1 >/dev/null
	dra_require "numa pod's claim deleted with it" 120 claim_gone default "$claim"
	kubectl -n default delete -f "$DRA_EXAMPLES/alignment/gpu-numa-vf.yaml" >/dev/null
	check "numa claim unprepared: its CDI spec gone" wait_for 30 "numa spec removed" test "$(our_cdi_specs | wc -l)" = 2
}

# dra_unsatisfiable: with a rail's PF down its VFs are unusable; a claim
# pinned to that rail's GPU must stay unallocated (not a VF of another
# rail), and get the rail's VF once the PF is up again.
dra_unsatisfiable() {
	local pf pfaddr gpuaddr='' taken
	# A rail whose GPU no claim holds yet: the fixture's GPU of a rail is on
	# the bus after its NIC's, under the same switch (and PCIe root).
	taken=$(allocated_gpus)
	for pf in $(tac "$RUN/pf-standins"); do
		pfaddr=$(jq -r --arg n "$pf" '.devices[] | select(.netdev == $n and .pfAddress == "") | .pciAddress' "$RUN/discover.json")
		gpuaddr=$(printf '%s:%02x:00.0' "${pfaddr:0:4}" $((16#${pfaddr:5:2} + 1)))
		grep -qxF "$(gpu_device "$gpuaddr")" <<<"$taken" || break
		gpuaddr=
	done
	require "a rail whose GPU no claim holds (GPU $gpuaddr, PF $pf)" 1 test -n "$gpuaddr"
	local root
	root=$(dev_attr "$GPU_DRIVER" "$(gpu_device "$gpuaddr")" resource.kubernetes.io/pcieRoot)
	check "GPU $gpuaddr ($root) is on the PCIe root of PF $pfaddr's VFs" test -n "$root" -a "$root" = "$(vf_field "$pfaddr" pcieRoot)"
	ip link set "$pf" down
	require "PF $pf down: its VFs tainted (or, without DRADeviceTaints, unpublished)" 10 rail_unusable "$pfaddr"
	if (($(tainted_count "$pfaddr") == $(rail_vfs "$pfaddr"))); then
		pass "unusable VFs are published with the taint $DRA_DRIVER/unhealthy=pf-link-down:NoSchedule"
	else
		skip "the API server dropped device taints (DRADeviceTaints off): unusable VFs are left out instead"
	fi
	kubectl apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $STUCK_CLAIM, namespace: default}
spec:
  devices:
    requests:
      - name: gpu
        exactly:
          deviceClassName: $GPU_CLASS
          selectors: [{cel: {expression: 'device.attributes["resource.kubernetes.io"].pciBusID == "$gpuaddr"'}}]
      - name: vf
        exactly: {deviceClassName: $VF_CLASS}
    constraints:
      - {requests: [gpu, vf], matchAttribute: resource.kubernetes.io/pcieRoot}
---
apiVersion: v1
kind: Pod
metadata: {name: $STUCK_POD, namespace: default}
spec:
  restartPolicy: Never
  resourceClaims: [{name: gpu-vf, resourceClaimName: $STUCK_CLAIM}]
  containers:
    - name: train
      image: $WORKLOAD_IMAGE
      command: ["sleep", "3600"]
      resources: {claims: [{name: gpu-vf}]}
EOF
	dra_require "pod $STUCK_POD unschedulable while no VF of the GPU's rail is usable" 60 pod_pending_unschedulable default "$STUCK_POD"
	check "claim $STUCK_CLAIM stays unallocated (not a VF of another rail)" claim_unallocated default "$STUCK_CLAIM"
	ip link set "$pf" up
	require "PF $pf up: its VFs usable again" 10 rail_usable "$pfaddr"
	dra_require "pod $STUCK_POD Running once the rail is up" 120 pod_running default "$STUCK_POD"
	expect "claim $STUCK_CLAIM: its VF is on the GPU's rail" "$pfaddr" \
		"$(dev_attr "$DRA_DRIVER" "$(claim_device default "$STUCK_CLAIM" "$DRA_DRIVER")" pfPciAddress)"
}

# dra_plugin_restart kills the DRA plugin with three claims prepared: it
# comes back with them from its checkpoint, the pods run on.
dra_plugin_restart() {
	local pid restarts before
	before=$(dra_pods)
	check "the three DRA pods run ($before)" matches "$before" "^$TEMPLATE_POD=[0-9]+ $MULTUS_POD=[0-9]+ $STUCK_POD=[0-9]+ \$"
	expect "prepared claims in the DRA plugin's checkpoint" 3 "$(checkpoint_claims)"
	restarts=$(restart_count)
	pid=$(task_pid "$DS_NS" "$(kubectl -n "$DS_NS" get pods -l "app.kubernetes.io/name=$DS" -o jsonpath='{.items[0].metadata.name}')" "$DS")
	kill -KILL "$pid"
	require "DRA plugin (pid $pid) killed: restarted by the kubelet" 60 restarted "$restarts"
	require "DaemonSet Ready again" 120 ds_ready
	check "the restarted plugin loaded its 3 prepared claims" wait_for 30 "checkpoint loaded" plugin_log_has '"preparedClaims":3'
	check "ResourceSlices still list the $WANT_VFS VFs" count_is "$DRA_DRIVER" "$WANT_VFS"
	expect "pods keep their containers across the plugin restart" "$before" "$(dra_pods)"
	check "the claims' CDI specs are still there" test "$(our_cdi_specs | wc -l)" = 3
	check "the claims' device metadata CDI specs are still there" test "$(our_meta_specs | wc -l)" = 3
	check_metadata default "$TEMPLATE_POD" train resourceclaimtemplates/gpu-vf vf "$TEMPLATE_VF"
	# The CNI's network data is in the checkpoint too: a Prepare of the
	# claim by the restarted plugin would write it again.
	expect "the checkpoint keeps $MULTUS_POD's networkData" "$MULTUS_IFNAME" \
		"$(jq -r --arg a "$MULTUS_VF" '[.claims[].devices[] | select(.pciAddress == $a) | .networkData.interfaceName // ""] | join(",")' "$DRA_PLUGIN_DIR/checkpoint.json" 2>/dev/null)"
	VF_IFNAME=$MULTUS_IFNAME VF_ADDR=$MULTUS_ADDR check_metadata default "$MULTUS_POD" train "resourceclaims/$MULTUS_CLAIM" vf "$MULTUS_VF" "$MULTUS_NAD"
}

# dra_delete deletes the pods: their claims are released (the template's
# deleted with its pod, the others deallocated), the (restarted) plugin
# unprepares them — CDI specs, device-info files and checkpoint entries
# gone — and the VFs' stand-ins are back on the host.
dra_delete() {
	kubectl -n default delete pod "$TEMPLATE_POD" "$MULTUS_POD" "$STUCK_POD" "$PROBE_POD" --wait=false >/dev/null
	dra_require "DRA pods deleted" 120 no_dra_pods
	check "claim $TEMPLATE_CLAIM (made from the template) deleted with its pod" \
		wait_for 30 "template claim gone" claim_gone default "$TEMPLATE_CLAIM"
	check "claim $MULTUS_CLAIM released: deallocated, reserved for no pod" \
		wait_for 30 "claim released" claim_released default "$MULTUS_CLAIM"
	check "claim $STUCK_CLAIM released: deallocated, reserved for no pod" \
		wait_for 30 "claim released" claim_released default "$STUCK_CLAIM"
	kubectl delete -k "$RUN/dra-template" --ignore-not-found >/dev/null
	kubectl delete -k "$RUN/dra-multus" --ignore-not-found >/dev/null
	kubectl -n default delete resourceclaim "$STUCK_CLAIM" "$PROBE_CLAIM" >/dev/null
	check "claims unprepared: no $DRA_DRIVER CDI spec left in $CDI_DIR" wait_for 30 "specs removed" no_cdi_specs our_cdi_specs
	check "claims unprepared: no device metadata CDI spec left, nothing under $META_HOST_DIR" \
		wait_for 30 "metadata removed" no_metadata_left
	check "claims unprepared by the stand-in GPU driver too" wait_for 30 "gpu specs removed" no_cdi_specs gpu_cdi_specs
	check "no prepared claim left in the DRA plugin's checkpoint" wait_for 30 "checkpoint empty" checkpoint_is 0
	check "no device-info file left for the claims" wait_for 30 "devinfo empty" empty_dir "$DEVINFO_DIR"
	check "all $WANT_VFS stand-ins back on the host under their names and MACs" wait_for 30 "stand-ins back" standins_home
	expect "whereabouts IPPool $EXAMPLE_RANGE empty" "" "$(ippool_pods "$EXAMPLE_RANGE" | xargs)"
	check "sriov CNI state dir $SRIOV_STATE empty" no_state "$SRIOV_STATE"
	check "kubectl delete -k of the DRA deployment" kubectl delete -k "$RUN/deploy-dra" --timeout 120s
	# Uninstalled, the driver leaves nothing the kubelet or the scheduler
	# would still act on: its registration and plugin sockets go with it,
	# and the kubelet wipes its ResourceSlices once it has unregistered
	# (after a grace period for a plugin that restarts), so that no claim
	# is allocated devices nobody can prepare.
	check "DRA driver unregistered: $K/plugins_registry/$DRA_DRIVER-reg.sock removed" \
		wait_for 60 "registration socket removed" no_path "$K/plugins_registry/$DRA_DRIVER-reg.sock"
	check "DRA plugin socket $DRA_PLUGIN_DIR/dra.sock removed" wait_for 60 "plugin socket removed" no_path "$DRA_PLUGIN_DIR/dra.sock"
	check "DRA driver's CNI socket $DRA_PLUGIN_DIR/cni.sock removed" wait_for 60 "CNI socket removed" no_path "$DRA_PLUGIN_DIR/cni.sock"
	check "no ResourceSlice of $DRA_DRIVER left for the node once it unregistered" \
		wait_for 150 "ResourceSlices wiped" no_slices "$DRA_DRIVER"
	stop gpu-standin
	kubectl delete deviceclass "$GPU_CLASS" --ignore-not-found >/dev/null
}
