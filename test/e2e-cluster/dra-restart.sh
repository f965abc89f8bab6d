# shellcheck shell=bash
# Restarts in the DRA phase of make e2e-cluster (sourced by run.sh, called
# from test_dra): nothing prepared is lost when the kubelet restarts, when
# the node "reboots" (the CDI and device-info directories, tmpfs on a real
# node, emptied while the driver is down), and a deleted node's
# ResourceSlices go with it.

PROBE_POD=vf-restart-probe
PROBE_CLAIM=restart-vf

# each_vf_once: the node's slices of our driver list $WANT_VFS devices,
# none twice.
each_vf_once() {
	local names
	names=$(slice_devices "$DRA_DRIVER" | jq -r .name) || return 1
	[[ $(wc -l <<<"$names") == "$WANT_VFS" && $(sort -u <<<"$names" | wc -l) == "$WANT_VFS" ]]
}
# claims_share_no_vf: no VF of our driver is allocated to two claims.
claims_share_no_vf() {
	kubectl get resourceclaims -A -o json | jq_true --arg d "$DRA_DRIVER" \
		'[.items[].status.allocation.devices.results[]? | select(.driver == $d and (.adminAccess // false | not)) | .device] | length == (unique | length)'
}
# slices_owned_by_node DRIVER: every slice of DRIVER for the node has the
# Node (by its current UID) as its owner.
slices_owned_by_node() {
	local uid
	uid=$(kubectl get node "$NODE" -o jsonpath='{.metadata.uid}') || return 1
	node_slices "$1" | jq -s -e --arg u "$uid" --arg n "$NODE" \
		'length > 0 and all(.[]; any(.metadata.ownerReferences[]?; .kind == "Node" and .name == $n and .uid == $u))' >/dev/null
}
# kubelet_log_since LINE prints the kubelet's log from line LINE on.
kubelet_log_since() { tail -n "+$1" "$RUN/logs/kubelet.log"; }
kubelet_connected_dra() { kubelet_log_since "$1" | grep 'Connection changed' | grep -F "$DRA_DRIVER" | grep -q 'connected=true'; }
container_restarts() { kubectl -n "$1" get pod "$2" -o jsonpath='{.status.containerStatuses[0].restartCount}'; }
# restarted_running NS POD N PID: the pod's container restarted more than
# N times, runs, and is not PID.
restarted_running() {
	local pid
	(($(container_restarts "$1" "$2") > $3)) && pod_running "$1" "$2" &&
		pid=$(task_pid "$1" "$2" train) && [[ -n $pid && $pid != "$4" ]]
}
# claim_devinfo prints the device-info files of the checkpoint's claims.
claim_devinfo() { jq -r '.claims[].devInfo[]?' "$DRA_PLUGIN_DIR/checkpoint.json" | sort; }
# spec_sums prints our CDI specs' names and checksums.
spec_sums() { (cd "$CDI_DIR" && find . -maxdepth 1 -name "$DRA_DRIVER-vf_*.json" -exec sha256sum {} + | sort); }
# meta_sums: the helper's device metadata specs (KEP-5304), one per request.
meta_sums() { (cd "$CDI_DIR" && find . -maxdepth 1 -name "${DRA_DRIVER}_metadata_*.json" -exec sha256sum {} + | sort); }
all_exist() { local f; for f in "$@"; do [[ -e $f ]] || return 1; done; }

# dra_kubelet_restart restarts the kubelet with three claims prepared: the
# pods keep their containers, the claims stay prepared, the kubelet
# connects to the driver again, and the node's slices — which the kubelet
# deletes when it starts (no driver is registered then) — are published
# again by the driver, each VF once; a new pod then gets a VF no claim
# holds.
dra_kubelet_restart() {
	local before since
	before=$(dra_pods)
	since=$(($(wc -l <"$RUN/logs/kubelet.log") + 1))
	check "our ResourceSlices are owned by Node $NODE (its UID): the garbage collector deletes them with the Node" \
		slices_owned_by_node "$DRA_DRIVER"
	stop kubelet
	start_kubelet " (restarted in the DRA phase)"
	check "the restarted kubelet connected to the DRA driver again" wait_for 60 "kubelet connected to $DRA_DRIVER" kubelet_connected_dra "$since"
	check "ResourceSlices list the $WANT_VFS VFs again, each once, after the kubelet restart" wait_for 60 "slices republished" each_vf_once
	expect "pods keep their containers across the kubelet restart" "$before" "$(dra_pods)"
	expect "prepared claims in the checkpoint after the kubelet restart" 3 "$(checkpoint_claims)"
	check "the claims' CDI specs are still there" test "$(our_cdi_specs | wc -l)" = 3
	kubectl apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $PROBE_CLAIM, namespace: default}
spec:
  devices:
    requests: [{name: vf, exactly: {deviceClassName: $VF_CLASS}}]
---
apiVersion: v1
kind: Pod
metadata: {name: $PROBE_POD, namespace: default}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  resourceClaims: [{name: vf, resourceClaimName: $PROBE_CLAIM}]
  containers:
    - name: train
      image: $WORKLOAD_IMAGE
      command: ["sleep", "3600"]
      resources: {claims: [{name: vf}]}
EOF
	dra_require "pod $PROBE_POD Running after the kubelet restart" 120 pod_running default "$PROBE_POD"
	PROBE_VF=$(vf_of_device "$(claim_device default "$PROBE_CLAIM" "$DRA_DRIVER")")
	check "no VF allocated to two claims (claim $PROBE_CLAIM got $PROBE_VF)" claims_share_no_vf
	dra_check_pod default "$PROBE_POD" train "$PROBE_VF"
	expect "prepared claims in the checkpoint" 4 "$(checkpoint_claims)"
}

# dra_reboot: the node's tmpfs directories emptied while the driver is
# down (a reboot keeps /var/lib/kubelet, where the checkpoint is, and
# empties /var/run): the restarted driver writes its claims' CDI specs,
# device-info files and the helper's device metadata specs again, before
# the kubelet calls it, so that a container
# of a running pod that restarts — the kubelet does not prepare its claims
# again, the runtime resolves their CDI names from the directory — starts
# with its VF.
dra_reboot() {
	local specs sums msums infos pid restarts before_restarts
	specs=$(our_cdi_specs)
	sums=$(spec_sums)
	msums=$(meta_sums)
	mapfile -t infos < <(claim_devinfo)
	check "the 4 claims' CDI specs and their device-info files (${#infos[@]}) are there" \
		test "$(wc -l <<<"$specs")" = 4 -a "${#infos[@]}" -gt 0
	restarts=$(restart_count)
	pid=$(task_pid "$DS_NS" "$(kubectl -n "$DS_NS" get pods -l "app.kubernetes.io/name=$DS" -o jsonpath='{.items[0].metadata.name}')" "$DS")
	check "and their requests' device metadata specs ($(wc -l <<<"$msums"))" test -n "$msums"
	rm -f "$CDI_DIR/$DRA_DRIVER-vf_"*.json "$CDI_DIR/${DRA_DRIVER}_metadata_"*.json "${infos[@]}"
	kill -KILL "$pid"
	require "DRA plugin (pid $pid) killed with its claims' files gone: restarted" 60 restarted "$restarts"
	require "DaemonSet Ready again" 120 ds_ready
	check "the restarted driver wrote the 4 claims' CDI specs again, as they were" wait_for 30 "specs restored" test "$(spec_sums)" = "$sums"
	expect "the claims' CDI spec names" "$specs" "$(our_cdi_specs)"
	check "and their device-info files" wait_for 30 "device-info restored" all_exist "${infos[@]}"
	check "and the helper's device metadata specs, kept under the plugin directory" wait_for 30 "metadata specs restored" test "$(meta_sums)" = "$msums"
	check "the driver says so" plugin_log_has 'files restored from the checkpoint","claims":4'
	before_restarts=$(container_restarts default "$PROBE_POD")
	pid=$(task_pid default "$PROBE_POD" train)
	kill -KILL "$pid"
	dra_require "$PROBE_POD's container (pid $pid) killed: the kubelet starts it again, its CDI names resolved" 90 \
		restarted_running default "$PROBE_POD" "$before_restarts" "$pid"
	dra_check_pod default "$PROBE_POD" train "$PROBE_VF"
}

# dra_node_deleted: a node taken out of the cluster (its kubelet and
# drivers stopped, then kubectl delete node) leaves no ResourceSlice: the
# controller-manager's garbage collector deletes them, their owner (the
# Node, which the kubeletplugin helper names) being gone. The stand-in GPU
# driver's slices stand for any driver's: ours were wiped with the
# DaemonSet. The kubelet, started again, registers the Node anew.
dra_node_deleted() {
	start gpu-standin "$WORK/bin/gpu-standin" --host-root "$HOST" --kubeconfig "$KCFG/admin.kubeconfig" --node-name "$NODE"
	require "the stand-in GPU driver's 8 devices published" 60 count_is "$GPU_DRIVER" 8
	check "the stand-in's ResourceSlices are owned by Node $NODE (its UID)" slices_owned_by_node "$GPU_DRIVER"
	stop kubelet
	stop gpu-standin
	# Nothing on the node deletes them now (stopping leaves them).
	check "with the kubelet and the stand-in stopped, its 8 devices are still published" count_is "$GPU_DRIVER" 8
	check "kubectl delete node $NODE" kubectl delete node "$NODE" --wait=true --timeout 60s
	check "no ResourceSlice of the deleted node left (garbage collector)" wait_for 60 "GC deleted the node's slices" no_slices "$GPU_DRIVER"
	start_kubelet " (registers the deleted Node again)"
	# A Node registered anew has only the kubelet's labels: NFD would
	# label it again; here it is done by hand, as at deploy (checks.sh).
	kubectl label node "$NODE" "$NFD_LABEL=true" >/dev/null
	check "the Node registered anew has the label the DaemonSet selects ($NFD_LABEL)" \
		test "$(kubectl get node -l "$NFD_LABEL=true" -o name)" = "node/$NODE"
}
