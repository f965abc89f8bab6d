# shellcheck shell=bash
# The lifecycle phase of make e2e-cluster (sourced by run.sh): install,
# rolling upgrade and uninstall, as docs/install.md tells a user, on the
# one-node cluster. E2E_CLUSTER_PHASES=lifecycle runs it alone.
#
#   - Before the install the node has an "upstream" sriov CNI (a stand-in
#     script answering VERSION) and the fixture's 4 VFs on each rail.
#   - Install: deployments/ with components/provision and a policy of 6
#     VFs on two rails, made through kernel-standin (which plays the PCI
#     core and mlx5 for the plugin's sysfs writes and makes each VF's
#     netdev); a pod takes a VF.
#   - Upgrade: the tag changed to a second image (the same sources, built
#     with another version string) and applied; the pod keeps its
#     container (PID), its VF and net1; the new plugin reports the new
#     version; a new pod is served by it.
#   - Uninstall: the pods deleted, the plugin's DaemonSet deleted,
#     deployments/uninstall/ applied: the upstream sriov back byte for
#     byte, the rails back to the 4 VFs found, devinfo files, CDI specs
#     and state gone; the report says so.

LC_POLICY=e2e-lifecycle
LC_RAILS=(0000:18:00.0 0000:40:00.0) # the policy's pfNames ibp24s0, ibp64s0
LC_NUMVFS=6
LC_VERSION=v0.0.0-e2e-upgrade
LC_IMAGE=${FASTPATH_IMAGE%:*}:upgrade
LC_UNINSTALL=fastpath-uninstall
LC_UPSTREAM=/opt/cni/bin/sriov

# ------------------------------------------------------------ helpers

lc_numvfs() { cat "$HOST/sys/bus/pci/devices/$1/sriov_numvfs"; }
lc_virtfns() { find "$HOST/sys/bus/pci/devices/$1/" -maxdepth 1 -name 'virtfn*' | wc -l; }
# lc_rails prints "pf numvfs virtfns" of each rail of the policy.
lc_rails() {
	local pf
	for pf in "${LC_RAILS[@]}"; do echo "$pf $(lc_numvfs "$pf") $(lc_virtfns "$pf")"; done
}
lc_rails_are() { [[ $(lc_rails | awk '{ print $2 "/" $3 }' | sort -u | xargs) == "$1/$1" ]]; }
lc_plugin_pod() {
	kubectl -n "$DS_NS" get pods -l "app.kubernetes.io/name=$DS" -o json |
		jq -r '[.items[] | select(.metadata.deletionTimestamp == null)][0].metadata.name // ""'
}
lc_plugin_image() { kubectl -n "$DS_NS" get pod "$(lc_plugin_pod)" -o jsonpath='{.spec.containers[0].image}'; }
lc_build_version() {
	curl -sf "http://$(metrics_host):$METRICS_PORT/metrics" | sed -n 's/^fastpath_build_info{.*version="\([^"]*\)".*} 1$/\1/p'
}
lc_version_is() { [[ $(lc_build_version) == "$1" ]]; }
lc_allocated_above() { (($(metric fastpath_device_plugin_allocated_devices_total "resource=\"$RESOURCE\"") > $1)); }
# lc_net1_mac PID: the MAC of the pod's net1 ("" when it has none).
lc_net1_mac() { { in_pod "$1" ip -br link show net1 2>/dev/null || true; } | awk '{ print $3 }'; }
# lc_init_logged POD SHA: POD's install-sriov-cni log has install-cni's
# "installed" or "already installed" line for a sriov of sha256 SHA.
lc_init_logged() {
	cat "$RUN"/pod-logs/"${DS_NS}_$1"_*/install-sriov-cni/*.log 2>/dev/null |
		grep -E 'install-cni: (installed|already installed)' | grep -qF "sha256=$2"
}
lc_no_plugin_pods() { [[ -z $(kubectl -n "$DS_NS" get pods -l "app.kubernetes.io/name=$DS" -o name) ]]; }
lc_uninstall_ready() {
	kubectl -n "$DS_NS" get ds "$LC_UNINSTALL" -o json |
		jq_true '.status.desiredNumberScheduled == 1 and .status.numberReady == 1'
}
lc_report() {
	kubectl -n "$DS_NS" get pods -l "app.kubernetes.io/name=$LC_UNINSTALL" \
		-o jsonpath='{.items[0].status.initContainerStatuses[0].state.terminated.message}'
}
# Files of fastpath's on the node: device-info files of the pool, CDI
# specs, provisioning's state, the CNI's state files.
lc_fastpath_files() {
	{
		# A directory that is not there has nothing (find fails; set -e, pipefail).
		find "$DEVINFO_DIR" -name "${RESOURCE%%/*}-*" 2>/dev/null || true
		find "$CDI_DIR" -maxdepth 1 -name 'fastpath-*' 2>/dev/null || true
		find /var/lib/fastpath 2>/dev/null || true
		find "$SRIOV_STATE" -maxdepth 1 -name '0000:*' 2>/dev/null || true
	} | sort
}

# lc_pod NAME: a pod with one VF on the deployments' NAD sriov-rdma.
lc_pod() {
	kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: default
  annotations: {k8s.v1.cni.cncf.io/networks: sriov-rdma}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: train
      image: $WORKLOAD_IMAGE
      command: [sleep, "3600"]
      resources:
        requests: {cpu: 10m, memory: 16Mi, $RESOURCE: "1"}
        limits: {$RESOURCE: "1"}
EOF
}

# ------------------------------------------------------------ the phase

test_lifecycle() {
	phase "lifecycle: install with an upstream sriov CNI and provisioning, rolling upgrade with pods running, uninstall"
	lc_before
	lc_install
	lc_upgrade
	lc_uninstall
}

# lc_before: the upstream stand-in, the node as found, the second image.
lc_before() {
	mkdir -p "$(dirname "$LC_UPSTREAM")"
	printf '%s\n' '#!/bin/sh' '# stand-in for upstream sriov-cni (make e2e-cluster, lifecycle phase)' \
		'[ "$CNI_COMMAND" = VERSION ] && echo '"'"'{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0"]}'"'"' && exit 0' \
		'echo '"'"'{"code":100,"msg":"upstream stand-in"}'"'"'; exit 1' >"$LC_UPSTREAM"
	chmod 0755 "$LC_UPSTREAM"
	sha256sum "$LC_UPSTREAM" | cut -d' ' -f1 >"$RUN/lc-upstream.sha256"
	lc_rails >"$RUN/lc-rails.before"
	check "before the install: the rails have 4 VFs each ($(awk '{ print $1 "=" $2 }' "$RUN/lc-rails.before" | xargs))" lc_rails_are 4
	start kernel-standin "$WORK/bin/kernel-standin" --host-root "$HOST" --links-file "$RUN/standins"
	require "kernel stand-in watches the fixture host's sysfs" 30 grep -q 'kernel stand-in watching' "$RUN/logs/kernel-standin.log"
	local t0
	t0=$(date +%s.%N)
	OUT=$RUN/upgrade/fastpath.tar IMAGE=$LC_IMAGE VERSION=$LC_VERSION DEB_CACHE=$WORK/debs "$REPO/test/imagetar/build.sh" 2>>"$RUN/logs/image-upgrade.log"
	ctr images import --all-platforms "$RUN/upgrade/fastpath.tar" >/dev/null
	check "a second image $LC_IMAGE (version $LC_VERSION) in containerd ($(elapsed "$t0")s)" ctr images check "name==$LC_IMAGE"
}

# lc_overlay DIR TAG writes the install's overlay: deployments/ with the
# image TAG, the fixture host for the node's sysfs and devices, the API
# server's address (no kube-proxy here), components/provision with its
# sysfs mounts on the fixture and the phase's policy.
lc_overlay() {
	local dir=$1 tag=$2 host_volumes
	host_volumes=$(host_volumes "$HOST")
	write_overlay "$dir" "$(realpath --relative-to="$dir" "$REPO/deployments")" <<EOF
images:
  - name: ghcr.io/fastpath-k8s/fastpath
    newName: ${FASTPATH_IMAGE%:*}
    newTag: "$tag"
components: [$(realpath --relative-to="$dir" "$REPO/deployments/components/provision")]
patches:
  - target: {kind: DaemonSet, name: $DS}
    patch: '{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "$DS", "namespace": "$DS_NS"},
      "spec": {"template": {"spec": {"volumes": $host_volumes}}}}'
  - target: {kind: DaemonSet, name: $DS}
    patch: '{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "$DS", "namespace": "$DS_NS"},
      "spec": {"template": {"spec": {"volumes": [{"name": "sys-devices", "hostPath": {"path": "$HOST/sys/devices"}},
        {"name": "sys-bus-pci", "hostPath": {"path": "$HOST/sys/bus/pci"}}]}}}}'
  - target: {kind: DaemonSet, name: $DS}
    patch: |-
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --node-root=$HOST}
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_HOST, value: "$API_HOST"}}
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}}
  - target: {kind: ConfigMap, name: fastpath-policies}
    patch: |-
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: fastpath-policies, namespace: $DS_NS}
      data:
        policies.yaml: |
$(sed 's/^/          /' "$RUN/lc-policy.yaml")
EOF
}

lc_install() {
	cat >"$RUN/lc-policy.yaml" <<EOF
apiVersion: sriovnetwork.openshift.io/v1
kind: SriovNetworkNodePolicy
metadata: {name: $LC_POLICY}
spec:
  resourceName: ${RESOURCE#*/}
  numVfs: $LC_NUMVFS
  nicSelector: {vendor: "15b3", pfNames: [ibp24s0, ibp64s0]}
  deviceType: netdevice
  isRdma: true
EOF
	lc_overlay "$RUN/deploy-lifecycle" "${FASTPATH_IMAGE##*:}"
	kubectl label node "$NODE" "$NFD_LABEL=true" --overwrite >/dev/null
	check "kubectl apply -k: deployments/ with components/provision, a policy of $LC_NUMVFS VFs on 2 rails" kubectl apply -k "$RUN/deploy-lifecycle"
	require "DaemonSet $DS_NS/$DS Ready on $NODE" 180 ds_ready
	check "the init container kept the upstream sriov as sriov.pre-fastpath, byte for byte" \
		test "$(sha256sum "$LC_UPSTREAM.pre-fastpath" 2>/dev/null | cut -d' ' -f1)" = "$(<"$RUN/lc-upstream.sha256")"
	check "the installed sriov is fastpath's CNI (go version -m) and answers VERSION" \
		bash -c "go version -m '$LC_UPSTREAM' | grep -q 'path[[:space:]]*github.com/fastpath-k8s/fastpath/cmd/sriov-cni' && CNI_COMMAND=VERSION '$LC_UPSTREAM' </dev/null | grep -q supportedVersions"
	check "provisioning made $LC_NUMVFS VFs on each rail through the stand-in" \
		wait_for 60 "rails at $LC_NUMVFS" lc_rails_are "$LC_NUMVFS"
	local pf
	for pf in "${LC_RAILS[@]}"; do
		check "provisioning recorded what $pf had: 4 VFs (/var/lib/fastpath/provision/found/$pf.json)" \
			jq_true '.numVfs == 4' <"/var/lib/fastpath/provision/found/$pf.json"
	done
	local want
	want=$("$WORK/bin/rdma-device-plugin" discover --host-root "$HOST" --config "$CONFIG" --policy "$RUN/lc-policy.yaml" -o json |
		jq --arg r "$RESOURCE" '[.pools[] | select(.resource == $r) | .devices[]] | length')
	require "node allocatable $RESOURCE = $want (discover's count with the policy's VFs)" 60 allocatable_is "$RESOURCE" "$want"
	lc_pod lc-before
	require "pod lc-before Running with a VF" 120 pod_running default lc-before
	LC_PID=$(task_pid default lc-before train || true)
	LC_VF=$(pod_vfs default/lc-before || true)
	LC_MAC=$(lc_net1_mac "$LC_PID")
	check "lc-before: its VF $LC_VF is net1 in the pod (MAC $LC_MAC)" matches "$LC_MAC" '^[0-9a-f:]{17}$'
	LC_FIRST_VERSION=$(lc_build_version || true)
	check "the plugin reports its version ($LC_FIRST_VERSION)" test -n "$LC_FIRST_VERSION"
}

lc_upgrade() {
	local t0 old_pod
	old_pod=$(lc_plugin_pod)
	lc_overlay "$RUN/deploy-lifecycle" "${LC_IMAGE##*:}"
	t0=$(date +%s.%N)
	check "kubectl apply -k with the new tag ${LC_IMAGE##*:}" kubectl apply -k "$RUN/deploy-lifecycle"
	check "kubectl rollout status: the DaemonSet rolled" kubectl -n "$DS_NS" rollout status "ds/$DS" --timeout 180s
	require "DaemonSet Ready with the new pod" 60 ds_ready
	log "rolling upgrade: $(elapsed "$t0")s"
	check "a new plugin pod ($(lc_plugin_pod), was $old_pod) runs $LC_IMAGE" test "$(lc_plugin_image)" = "$LC_IMAGE"
	check "the new plugin reports version $LC_VERSION (fastpath_build_info; was $LC_FIRST_VERSION)" \
		wait_for 60 "version $LC_VERSION" lc_version_is "$LC_VERSION"
	# The CNI does not link the version package, so both images' sriov are
	# the same bytes (the same sources): the new pod's init container says
	# it installed, or found, exactly the sriov the node now has.
	check "the new pod's init container installed (or found) the sriov the node has (sha256 in its log)" \
		lc_init_logged "$(lc_plugin_pod)" "$(sha256sum "$LC_UPSTREAM" | cut -d' ' -f1)"
	check "sriov.pre-fastpath is still the upstream, byte for byte (never overwritten)" \
		test "$(sha256sum "$LC_UPSTREAM.pre-fastpath" | cut -d' ' -f1)" = "$(<"$RUN/lc-upstream.sha256")"
	expect "lc-before keeps its container (same PID)" "$LC_PID" "$(task_pid default lc-before train)"
	expect "lc-before keeps its VF (PodResources)" "$LC_VF" "$(pod_vfs default/lc-before)"
	expect "lc-before keeps net1 (same MAC)" "$LC_MAC" "$(lc_net1_mac "$LC_PID")"
	check "the new plugin changed no VF count ($(lc_rails | awk '{ print $1 "=" $2 }' | xargs))" lc_rails_are "$LC_NUMVFS"
	lc_pod lc-after
	require "pod lc-after Running with a VF" 120 pod_running default lc-after
	local pid
	pid=$(task_pid default lc-after train || true)
	check "lc-after: a VF ($(pod_vfs default/lc-after)) as net1" matches "$(lc_net1_mac "$pid")" '^[0-9a-f:]{17}$'
	check "lc-after was served by the new plugin (its fastpath_device_plugin_allocated_devices_total > 0)" lc_allocated_above 0
}

lc_uninstall() {
	local t0 dir=$RUN/uninstall
	t0=$(date +%s.%N)
	kubectl -n default delete pod lc-before lc-after --wait=true --timeout 120s >/dev/null
	check "the plugin's DaemonSet deleted (--wait)" kubectl -n "$DS_NS" delete ds "$DS" --wait=true --timeout 120s
	require "no plugin pod left" 60 lc_no_plugin_pods
	write_overlay "$dir" "$(realpath --relative-to="$dir" "$REPO/deployments/uninstall")" <<EOF
images:
  - name: ghcr.io/fastpath-k8s/fastpath
    newName: ${FASTPATH_IMAGE%:*}
    newTag: "${LC_IMAGE##*:}"
patches:
  - target: {kind: DaemonSet, name: $LC_UNINSTALL}
    patch: '{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "$LC_UNINSTALL", "namespace": "$DS_NS"},
      "spec": {"template": {"spec": {"volumes": [{"name": "sys", "hostPath": {"path": "$HOST/sys"}},
        {"name": "sys-devices", "hostPath": {"path": "$HOST/sys/devices"}}, {"name": "sys-bus-pci", "hostPath": {"path": "$HOST/sys/bus/pci"}}]}}}}'
EOF
	check "kubectl apply -k deployments/uninstall/" kubectl apply -k "$dir"
	require "the uninstall's pod Ready on $NODE (its init container done)" 180 lc_uninstall_ready
	log "uninstall: $(elapsed "$t0")s"
	lc_report >"$RUN/logs/uninstall-report.txt"
	check "the report (termination message) ends: this node is as before fastpath" \
		grep -qx "this node is as before fastpath" "$RUN/logs/uninstall-report.txt"
	check "the report names both rails back: $(grep -c 'VFs 6 -> 4, as before fastpath' "$RUN/logs/uninstall-report.txt") of 2" \
		test "$(grep -c "VFs $LC_NUMVFS -> 4, as before fastpath" "$RUN/logs/uninstall-report.txt")" = 2
	check "/opt/cni/bin/sriov is the upstream again, byte for byte" \
		test "$(sha256sum "$LC_UPSTREAM" | cut -d' ' -f1)" = "$(<"$RUN/lc-upstream.sha256")"
	check "no sriov.pre-fastpath left" test ! -e "$LC_UPSTREAM.pre-fastpath"
	same "the rails' VF counts (sriov_numvfs, virtfn links) as before the install" "$RUN/lc-rails.before" lc_rails
	same "no device-info file, CDI spec, provisioning state or CNI state of fastpath's on the node" /dev/null lc_fastpath_files
	check "kubectl delete -k deployments/uninstall/" kubectl delete -k "$dir" --timeout 120s
	check "kubectl delete -k deployments/ --ignore-not-found" kubectl delete -k "$RUN/deploy-lifecycle" --ignore-not-found --timeout 120s
	stop kernel-standin
	rm -f "$LC_UPSTREAM" # the host as before the phase
}
