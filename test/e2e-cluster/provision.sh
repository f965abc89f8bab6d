# shellcheck shell=bash
# The provisioning phase of make e2e-cluster (sourced by run.sh), after the
# DRA phase: the device plugin with deployments/components/provision, as a
# user turns it on. What is checked is the cluster's side of it: the
# component applies (capabilities, mounts, RBAC), the plugin reads its own
# Node's labels from the API server with its token and the component's
# RBAC, matches the policy's nodeSelector against them, and says why when
# the RBAC is missing. The fixture host's VFs are left as they are: the
# policy here is the fixture's (4 VFs on each rail) and externallyManaged,
# so nothing is written to sysfs (no kernel here creates VFs).

PROVISION_LABEL=fastpath-e2e.io/provision
PROVISION_POLICY=e2e-rails
PROVISION_RBAC=fastpath-rdma-provision # deployments/components/provision/rbac.yaml
RAIL0=0000:18:00.0                     # the fixture's ibp24s0

test_provision() {
	provision_deploy
	provision_without_rbac
	provision_delete
}

desired_vfs() { metric fastpath_provision_vfs_desired "pf=\"$RAIL0\",policy=\"$PROVISION_POLICY\""; }
desired_is() { [[ $(desired_vfs) == "$1" ]]; }
plugin_pod() { kubectl -n "$DS_NS" get pods -l "app.kubernetes.io/name=$DS" -o jsonpath='{.items[0].metadata.name}'; }
pod_log_has() { plugin_log | grep -qF -- "$1"; }

# provision_deploy applies the device plugin's overlay (image, fixture host
# root) with the component on top; beyond what api_overlay changes (the API
# server's address), its read-write sysfs mounts go to the fixture host's
# too, and the policy is the fixture's.
provision_deploy() {
	local dir=$RUN/deploy-provision
	api_overlay "$dir" # dra.sh
	cat >>"$dir/kustomization.yaml" <<OVERLAY
  - target: {kind: DaemonSet, name: $DS}
    patch: '{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "$DS", "namespace": "$DS_NS"},
      "spec": {"template": {"spec": {"volumes": [{"name": "sys-devices", "hostPath": {"path": "$HOST/sys/devices"}},
        {"name": "sys-bus-pci", "hostPath": {"path": "$HOST/sys/bus/pci"}}]}}}}'
  - target: {kind: ConfigMap, name: fastpath-policies}
    patch: |-
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: fastpath-policies, namespace: $DS_NS}
      data:
        policies.yaml: |
          apiVersion: sriovnetwork.openshift.io/v1
          kind: SriovNetworkNodePolicy
          metadata: {name: $PROVISION_POLICY}
          spec:
            resourceName: mlnx_sriov_rdma
            nodeSelector: {$PROVISION_LABEL: "true"}
            numVfs: 4
            nicSelector: {vendor: "15b3", pfNames: [ibp24s0, ibp64s0, ibp79s0, ibp94s0, ibp154s0, ibp192s0, ibp206s0, ibp220s0]}
            externallyManaged: true
            isRdma: true
OVERLAY
	echo "components: [$(realpath --relative-to="$dir" "$REPO/deployments/components/provision")]" >>"$dir/kustomization.yaml"
	kubectl kustomize "$dir" >"$RUN/deploy-provision.yaml"
	check "kubectl kustomize with components/provision: --policy, CAP_NET_ADMIN, sysfs from the fixture only" \
		provision_rendered "$RUN/deploy-provision.yaml"
	kubectl label node "$NODE" "$PROVISION_LABEL=true" --overwrite >/dev/null
	check "kubectl apply -k of the overlay with components/provision" kubectl apply -k "$dir"
	require "DaemonSet $DS_NS/$DS (provisioning) Ready on $NODE" 180 ds_ready
	check "the plugin read its Node's labels from the API server (its token, the component's RBAC)" \
		wait_for 30 "labels read" pod_log_has "\"from\":\"node $NODE (API server)\""
	check "the policy's nodeSelector matched: fastpath_provision_vfs_desired{pf=$RAIL0,policy=$PROVISION_POLICY} = 4" \
		wait_for 30 "desired 4" desired_is 4
	require "node allocatable $RESOURCE = $WANT_VFS" 60 allocatable_is "$RESOURCE" "$WANT_VFS"
}

# provision_rendered FILE: the DaemonSet of the rendered overlay passes
# --policy, adds exactly NET_ADMIN, and mounts sysfs from the fixture only.
provision_rendered() {
	kubectl create --dry-run=client -o json -f "$1" | jq -s -e --arg h "$HOST" '
		[.[] | select(.kind == "DaemonSet")][0].spec.template.spec as $s
		| ($s.containers[0].args | index("--policy=/etc/fastpath-policies/policies.yaml") != null)
		and ($s.containers[0].securityContext.capabilities.add == ["NET_ADMIN"])
		and ([$s.volumes[] | .hostPath.path // "" | select(test("^/sys(/|$)"))] == [])
		and ([$s.volumes[] | select(.name == "sys-devices" or .name == "sys-bus-pci") | .hostPath.path | startswith($h)] == [true, true])' >/dev/null
}

# provision_without_rbac: the binding gone and the pod restarted, the
# plugin says the RBAC is missing, leaves the policy (it has a
# nodeSelector) out, and still serves its pools.
provision_without_rbac() {
	kubectl delete clusterrolebinding "$PROVISION_RBAC" >/dev/null
	kubectl -n "$DS_NS" delete pod "$(plugin_pod)" --wait=true --timeout 60s >/dev/null
	require "DaemonSet $DS_NS/$DS Ready again without the RBAC" 180 ds_ready
	check "without get on nodes the plugin logs the 403 and names RBAC" \
		wait_for 30 "403 logged" pod_log_has "forbidden (403): the service account needs RBAC get on nodes"
	check "the policy with a nodeSelector is left out: no fastpath_provision_vfs_desired for it" \
		wait_for 30 "no desired" desired_is 0
	require "node allocatable $RESOURCE = $WANT_VFS (the config's pools are served)" 60 allocatable_is "$RESOURCE" "$WANT_VFS"
}

provision_delete() {
	check "kubectl delete -k of the provisioning deployment" \
		kubectl delete -k "$RUN/deploy-provision" --ignore-not-found --timeout 120s
	kubectl label node "$NODE" "$PROVISION_LABEL-" >/dev/null
}
