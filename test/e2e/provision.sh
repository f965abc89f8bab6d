# shellcheck shell=bash
# The provisioning phase of `make e2e` (sourced by run.sh, which calls
# test_provision after its first phase; see test/e2e/README.md). The real
# rdma-device-plugin, under the same kubelet, serves `--policy` (the seed's
# SriovNetworkNodePolicy) on a copy of the DGX host that has no VF
# (dgx-h100-novfs). Its real SysfsKernel writes the copy's sysfs, and
# kernel-standin (test/e2e/cmd/kernel-standin) reacts to each write as the
# PCI core and mlx5 would, making each VF's netdev as a veth on the host.
# This kernel has no IPoIB netdev, so the GUIDs go through MLNX_OFED's
# sriov/<vf>/node and port files, not rtnetlink (docs/vfs.md).

POLICY_SEED=$REPO/testdata/policy/seed.yaml
PROV=$RUN/provision # the policy the plugin reads, its state dir, the plan
POLICY=$PROV/policy.yaml
PROV_RAILS=8 PROV_NUMVFS=8 PROV_SHRUNK=4

sys_dev() { echo "$HOST/sys/bus/pci/devices/$1${2:+/$2}"; }
vf_of() { basename "$(readlink "$(sys_dev "$1" "virtfn$2")")"; }
plan_pfs() { jq -r '.pfs[].pf' "$PROV/plan.json"; }

# vf_ready VF: bound to mlx5_core, with a netdev and an RDMA device.
vf_ready() {
	local d
	d=$(sys_dev "$1")
	[[ $(basename "$(readlink "$d/driver")") == mlx5_core && -n $(ls "$d/net" 2>/dev/null) && -n $(ls "$d/infiniband" 2>/dev/null) ]]
}

# pf_has PF N: sriov_numvfs reads N, N VFs on the bus, each ready.
pf_has() {
	local pf=$1 n=$2 k links
	links=$(find "$(sys_dev "$pf")/" -maxdepth 1 -name 'virtfn*' | wc -l)
	[[ $(<"$(sys_dev "$pf" sriov_numvfs)") == "$n" && $links == "$n" ]] || return 1
	for ((k = 0; k < n; k++)); do vf_ready "$(vf_of "$pf" "$k")" || return 1; done
}

# pfs_have N [EXCEPT]: every PF of the plan but EXCEPT has N ready VFs.
pfs_have() {
	local pf
	for pf in $(plan_pfs); do
		[[ $pf == "${2:-}" ]] && continue
		pf_has "$pf" "$1" || return 1
	done
}

# guids_as_planned: each VF's RDMA device has the node GUID the plan's
# GUID step gives it, and MLNX_OFED's port file holds it too.
guids_as_planned() {
	local pf k g vf ib node port n=0
	while read -r pf k g; do
		vf=$(vf_of "$pf" "$k")
		ib=$(ls "$(sys_dev "$vf" infiniband)" 2>/dev/null || true)
		node=$(cat "$HOST/sys/class/infiniband/${ib:-none}/node_guid" 2>/dev/null || true)
		port=$(cat "$(sys_dev "$pf" "sriov/$k/port")" 2>/dev/null || true)
		if [[ -z $ib || ${node//:/} != "${g//:/}" || $port != "$g" ]]; then
			log "GUID of VF $k of $pf ($vf): want $g; RDMA device '$ib', its node_guid '$node'; MLNX_OFED port '$port'"
			return 1
		fi
		n=$((n + 1))
	done < <(jq -r '.pfs[] | .pf as $pf | .steps[] | select(startswith("set VF node/port GUID ")) | "\($pf) \(ltrimstr("set VF node/port GUID "))"' "$PROV/plan.json")
	((n == PROV_RAILS * PROV_NUMVFS))
}

vf_links() { ip -o link show | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' | grep -cE '^ibp[0-9]+s[0-9]+v[0-9]+$'; }
allocatable_is() { [[ $(allocatable_count) == "$1" ]]; }

# plugin_log JQ: the current plugin's JSON log lines through JQ.
plugin_log() { jq -R -r "fromjson? | $1" "$RUN/logs/rdma-device-plugin.log"; }
logged() { [[ -n $(plugin_log "select(.msg == \"$1\") | .msg") ]]; }
refusals() { plugin_log "select(.msg == \"provision: PF left as it is\" and .pf == \"$BUSY_PF\") | .err"; }
refused_at_least() { (($(refusals | wc -l) >= $1)); }

# start_policy_plugin OLD LABEL: the plugin as a node runs it with a
# policy; the previous instance's log is kept as rdma-device-plugin.OLD.log.
start_policy_plugin() {
	mv "$RUN/logs/rdma-device-plugin.log" "$RUN/logs/rdma-device-plugin.$1.log"
	# --config names no file: the policy's pool is the only one.
	start rdma-device-plugin "$WORK/bin/rdma-device-plugin" --policy "$POLICY" --config "$PROV/no-config.json" \
		--host-root "$HOST" --node-root "$HOST" --kubelet-dir "$DP_DIR" --devinfo-dir "$RUN/devinfo" \
		--pod-resources-socket "$PODRES_SOCK" --cni-state-dir "$CNI_STATE" --provision-state-dir "$PROV/state" \
		--provision-retry 1s --metrics-addr 127.0.0.1:0 --log-level debug
	require "device plugin with --policy serves /metrics$2" 60 metrics_addr
	METRICS=http://$(metrics_addr)/metrics
	require "provisioning at start done$2" 60 logged provisioned
}

# provision_setup swaps the first phase's host for the DGX host without
# VFs, at the same path (containerd hands it to the CNI), and plans.
provision_setup() {
	local name peer
	stop rdma-device-plugin
	while read -r name peer; do ip link del "$name" 2>/dev/null || true; done <"$RUN/standins"
	rm -rf "$HOST" "$PROV" && mkdir -p "$PROV"
	cp -a "$REPO/testdata/sysfs/dgx-h100-novfs" "$HOST"
	make_char_devices
	cp "$POLICY_SEED" "$POLICY"
	"$WORK/bin/rdma-device-plugin" provision --dry-run -o json --policy "$POLICY" --host-root "$HOST" \
		--pod-resources-socket "" --cni-state-dir "" --provision-state-dir "$PROV/state" >"$PROV/plan.json"
	check "the seed's policy plans $PROV_RAILS rails from 0 to $PROV_NUMVFS VFs (provision --dry-run)" test \
		"$(jq -c '[.pfs[] | select(.numVfs == 0 and .want == 8 and (.refused | not))] | length' "$PROV/plan.json")" = "$PROV_RAILS"
	start kernel-standin "$WORK/bin/kernel-standin" --host-root "$HOST" --links-file "$RUN/standins"
	require "kernel stand-in watches the host's sysfs" 30 grep -q 'kernel stand-in watching' "$RUN/logs/kernel-standin.log"
}

test_provision() {
	phase "provisioning: the seed's policy on the DGX host without VFs (dgx-h100-novfs), kernel played by kernel-standin"
	provision_setup
	start_policy_plugin static ""
	check "$PROV_RAILS rails: sriov_numvfs $PROV_NUMVFS, $PROV_NUMVFS VFs each bound to mlx5_core with a netdev and an RDMA device" pfs_have "$PROV_NUMVFS"
	check "$((PROV_RAILS * PROV_NUMVFS)) VF GUIDs as planned (each RDMA device's node_guid; MLNX_OFED sriov/<vf>/port)" guids_as_planned
	expect "VF netdevs on the host (veths made by the stand-in as the VFs were probed)" $((PROV_RAILS * PROV_NUMVFS)) "$(vf_links)"
	WANT_VFS=$((PROV_RAILS * PROV_NUMVFS))
	require "kubelet advertises $WANT_VFS x $RESOURCE from the policy's pool" 60 advertised

	# The first phase's pod checks, on a pod of its own name.
	"$WORK/bin/rdma-device-plugin" discover --host-root "$HOST" --policy "$POLICY" -o json >"$RUN/discover.json"
	local vf name
	: >"$RUN/standins.mac"
	for vf in $(jq -r --arg r "$RESOURCE" '.pools[] | select(.resource == $r) | .devices[]' "$RUN/discover.json"); do
		name=$(vf_field "$vf" netdev)
		echo "$vf $name s${name#ib} $(<"/sys/class/net/$name/address")" >>"$RUN/standins.mac"
	done
	mv "$RUN/logs/sriov-cni.log" "$RUN/logs/sriov-cni.static.log" 2>/dev/null || true
	POD=rdma-e2e-provisioned STATIC_POD=rdma-e2e-provisioned-$NODE
	start_pod
	test_pod_devices
	test_pod_network
	test_provision_shrink
}

# test_provision_shrink: the policy asks for 4 VFs while the pod holds one.
test_provision_shrink() {
	local pid=$PID mac
	BUSY_PF=$(basename "$(readlink "$(sys_dev "$VF" physfn)")")
	sed -i "s/^\(\s*numVfs:\) $PROV_NUMVFS\$/\1 $PROV_SHRUNK/" "$POLICY"
	check "policy file changed to numVfs: $PROV_SHRUNK" grep -q "numVfs: $PROV_SHRUNK\$" "$POLICY"
	stop rdma-device-plugin
	start_policy_plugin policy-$PROV_NUMVFS " (numVfs: $PROV_SHRUNK)"
	local err
	err=$(refusals | head -n1)
	check "PF $BUSY_PF (the pod's VF $VF) refused, naming the pod: ${err:0:300}" grep -q "pod $POD_NS/$STATIC_POD" <<<"$err"
	check "refused PF $BUSY_PF keeps sriov_numvfs $PROV_NUMVFS and its VFs ready" pf_has "$BUSY_PF" "$PROV_NUMVFS"
	check "the other $((PROV_RAILS - 1)) PFs went to $PROV_SHRUNK ready VFs" pfs_have "$PROV_SHRUNK" "$BUSY_PF"
	require "kubelet advertises $(((PROV_RAILS - 1) * PROV_SHRUNK + PROV_NUMVFS)) x $RESOURCE" 60 \
		allocatable_is $(((PROV_RAILS - 1) * PROV_SHRUNK + PROV_NUMVFS))
	expect "pod keeps its VF (PodResources)" "$VF" "$(podres list --pod "$POD_NS/$STATIC_POD" --resource "$RESOURCE" | cut -f4)"
	expect "pod's container keeps running (same PID)" "$pid" "$(app_pid || true)"
	mac=$(in_pod ip -br link show eth0 2>/dev/null | awk '{ print $3 }')
	expect "pod eth0 is still the VF's netdev (by MAC)" "$VF_MAC" "$mac"
	require "the refusal is retried (--provision-retry 1s), still refused" 30 refused_at_least 2

	rm -f "$K/manifests/$POD.yaml"
	require "pod stopped after its manifest was removed" 60 no_pod_tasks
	check "PodResources no longer lists the pod" wait_for 30 "pod gone from PodResources" pod_gone
	require "refused PF $BUSY_PF converges to $PROV_SHRUNK ready VFs on a retry" 60 pf_has "$BUSY_PF" "$PROV_SHRUNK"
	check "plugin logged that every PF is as its policy says" wait_for 10 "retry done" logged "provision: every PF is as its policy says"
	require "kubelet advertises $((PROV_RAILS * PROV_SHRUNK)) x $RESOURCE" 60 allocatable_is $((PROV_RAILS * PROV_SHRUNK))
	expect "VF netdevs on the host" $((PROV_RAILS * PROV_SHRUNK)) "$(vf_links)"
	check "CNI state dir $CNI_STATE is empty" bash -c "[[ -z \$(ls -A $CNI_STATE 2>/dev/null | grep -v '^deleted-.*\\.json\$') ]]"
}
