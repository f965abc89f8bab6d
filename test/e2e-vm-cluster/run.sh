#!/usr/bin/env bash
# make e2e-vm-cluster: the seed's flow on two real nodes. Two QEMU guests
# (TCG) boot Debian's kernel with an initramfs that is a Kubernetes node:
# the kubelet, containerd and Debian's runc, the CNI reference plugins,
# Multus (thin plugin) and whereabouts, the images imported into its
# containerd. Each guest has an igb PF (SR-IOV, real igbvf VFs) on one wire
# between the two QEMU processes (a stream netdev over a unix socket) and a
# management NIC on user-mode networking, through which its kubelet reaches
# the control plane make e2e-cluster's functions run on the host
# (test/e2e-cluster/cluster.sh; the guests see the host's 127.0.0.1 as
# 10.0.2.2). The node joins with a client certificate of the test CA. Then
# the shipped DaemonSet (kubectl apply -k), the provisioning policy making
# node A's VFs, node B's made by hand, the seed's NAD and training pod,
# one per node; traffic between the nodes over their VFs; on a 7.x kernel
# RDMA bytes between the two pods over their VFs (soft-RoCE in each pod's
# netns, ibv_rc_pingpong and ib_write_bw -R; SKIPPED before 7.x, whose
# rdma_rxe is not netns-aware); the node's life (kubelet restart, plugin
# pod deleted, pods deleted). See test/e2e-vm-cluster/README.md.
#
# Usage (root): make e2e-vm-cluster [KERNEL=7.3]   or   test/e2e-vm-cluster/run.sh
# Env: WORK (default $REPO/.e2e-work, shared with make e2e-cluster and
# make e2e-kernel), KERNEL (6.12; 5.10, 6.1, 7.3), VM_MEM (MiB, 2048), VM_CPUS (2), VM_TIMEOUT
# (s, the whole run's guests, 2400).
#
# It starts the e2e control plane on the host's loopback (etcd, the API
# server, controller-manager, scheduler on make e2e-cluster's ports): one
# such run at a time on a machine, and not beside make e2e-cluster.
set -euo pipefail
VMC_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$VMC_DIR/../e2e-cluster/lib.sh"
RUN=$WORK/run-vm-cluster
source "$CLUSTER_DIR/cluster.sh"
source "$CLUSTER_DIR/checks.sh"

# The control plane listens on the host's loopback, where QEMU's user-mode
# networking takes what a guest sends to 10.0.2.2.
API_HOST=127.0.0.1
API=https://$API_HOST:$API_PORT
GUEST_HOST=10.0.2.2
API_ADVERTISE=$GUEST_HOST
API_EXTRA_SANS=IP:$GUEST_HOST
GUEST_API=https://$GUEST_HOST:$API_PORT
GUEST_IP=10.0.2.15 # each guest's own address on its management NIC

VM=$WORK/vm
# The guest kernel, one of test/e2e-kernel/kernel.sh's (KERNEL_ABI and
# KERNEL_PKG_VERSION from the environment win, as in make e2e-kernel).
source "$VMC_DIR/../e2e-kernel/kernel.sh"
kernel_select "${KERNEL:-$KERNEL_DEFAULT}" || exit 2
VM_MEM=${VM_MEM:-2048}
VM_CPUS=${VM_CPUS:-2}
VM_TIMEOUT=${VM_TIMEOUT:-2400}
# A guest whose /init has not said "VM-NODE init" on its console this
# many seconds after QEMU started is booted again, both guests with it
# (their PFs share one wire), at most VM_BOOT_TRIES times in all.
VM_BOOT_WAIT=${VM_BOOT_WAIT:-240}
VM_BOOT_TRIES=${VM_BOOT_TRIES:-3}
VM_NODES=(a b)
VM_CTL_PORT_a=16621
VM_CTL_PORT_b=16622
VFS=2 # on each node's PF: the policy's numVfs on A, by hand on B
RANGE=192.168.2.0/24 # the seed's NAD
NAD=sriov-net-ib
RESOURCE=mellanox.com/mlnx_sriov_rdma
RESOURCE_ENV=PCIDEVICE_MELLANOX_COM_MLNX_SRIOV_RDMA
POLICY_LABEL=feature.node.kubernetes.io/network-sriov.capable
MODULES="igb igbvf virtio_net bridge veth"
# RDMA bytes across the nodes (rdma) run where the guest kernel's
# rdma_rxe is netns-aware: 7.x opens rxe's UDP socket (RoCE v2, port
# 4791) in its netdev's netns; before 7.x it stays in the node's, and RC
# traffic between pods flushes (make e2e-kernel's cni/rdma-pods). There
# the guests get soft-RoCE and the verbs tools.
rdma_kernel() { [[ $KERNEL_ABI == 7.* ]]; }
RXE_MODULES="rdma_rxe ib_uverbs rdma_ucm"
if rdma_kernel; then MODULES+=" $RXE_MODULES"; fi
# The verbs tools, from the host's Debian packages (as make e2e-kernel
# takes them): rdma-core's ibv_rc_pingpong (ibverbs-utils) and its rxe
# provider (ibverbs-providers), perftest's ib_write_bw, iproute2's rdma,
# util-linux's script (a pty: a tool's output line by line, also when
# timeout kills it).
RDMA_DEBS="ibverbs-utils ibverbs-providers perftest iproute2 util-linux"
# The verbs tools are kernel.sh's (verbs_tool_paths); these beside them.
RDMA_TOOLS="rdma script"
RXE=rxe0 # each pod's soft-RoCE device (the name is node-wide: one per node)
ROCE_PORT=4791

vm_name() { echo "fp-vm-$1"; }
vm_port() { local v=VM_CTL_PORT_$1; echo "${!v}"; }

# ------------------------------------------------------------ the guests' image

# kernel_dir fetches (or finds in make e2e-kernel's cache, $WORK/kernel)
# the guest kernel KERNEL through test/e2e-kernel/kernel.sh, which handles
# each kernel's packaging; copy_with_libs is that file's too.
kernel_dir() {
	kernel_fetch "$WORK/kernel"
	[[ -f ${KERNEL_VMLINUZ:-} ]]
}

# guest_containerd_config: containerd as make e2e-cluster runs it, on the
# guest's own paths, with the two things an initramfs root needs: the
# native snapshotter, and runc without pivot_root (the initramfs root
# cannot be pivoted away from).
guest_containerd_config() {
	cat <<EOF
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "native"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "/usr/bin/runc"
        SystemdCgroup = false
        NoPivotRoot = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
EOF
}

# make_initramfs stages the node's root and packs it (newc, uncompressed);
# cached while its inputs are the same.
make_initramfs() {
	local runc inputs stamp
	runc=$(command -v runc)
	inputs=("$WORK/bin/kubelet" "$WORK/bin/containerd" "$WORK/bin/containerd-shim-runc-v2" "$WORK/bin/ctr"
		"$WORK"/cni-plugins/{bridge,host-local,loopback,multus,whereabouts,static}
		"$WORK/image/pause-oci.tar" "$WORK/fastpath-image/fastpath.tar" "$WORK/workload-image/workload.tar"
		"$VMC_DIR/init" "$VMC_DIR/vmnode" "$runc" "$KDIR/stamp" "$VMC_DIR/run.sh")
	if rdma_kernel; then inputs+=($(rdma_tool_paths)); fi
	stamp=$(stat -L -c '%n %s %Y' "${inputs[@]}" | sha256sum | cut -c1-16)
	INITRD=$VM/initramfs-$KERNEL_ABI.cpio
	if [[ -f $INITRD && $(cat "$INITRD.stamp" 2>/dev/null) == "$stamp" ]]; then
		log "initramfs: cached ($(du -m "$INITRD" | cut -f1) MiB)"
		return 0
	fi
	ROOT=$VM/root
	rm -rf "$ROOT" && mkdir -p "$ROOT"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,proc,sys,dev,tmp,run,etc,opt/cni/bin,var/lib,images}
	local busybox
	busybox=$(command -v busybox) || die "no busybox (apt-get install busybox-static)"
	ldd "$busybox" >/dev/null 2>&1 && die "$busybox is not static: apt-get install busybox-static"
	install -m 0755 "$busybox" "$ROOT/bin/busybox"
	copy_with_libs "$(readlink -f "$(command -v ip)")"
	[[ -e $ROOT/sbin/ip ]] || ln -s "$(readlink -f "$(command -v ip)")" "$ROOT/sbin/ip"
	copy_with_libs "$(readlink -f "$runc")"
	[[ -e $ROOT/usr/bin/runc ]] || ln -s "$(readlink -f "$runc")" "$ROOT/usr/bin/runc"
	if rdma_kernel; then
		# the verbs tools, their libraries, and rdma-core's soft-RoCE
		# provider with its driver file (kernel.sh), then rdma and script,
		# each called as /usr/bin/NAME in the guest
		copy_verbs_tools || die "the guests' verbs tools are missing (above)"
		local t
		for t in $RDMA_TOOLS; do
			t=$(readlink -f "$(type -P "$t")") # type -P: rdma is also a function here
			copy_with_libs "$t"
			[[ -e $ROOT/usr/bin/$(basename "$t") ]] || ln -s "$t" "$ROOT/usr/bin/$(basename "$t")"
		done
	fi
	install -m 0755 "$WORK/bin/kubelet" "$WORK/bin/containerd" "$WORK/bin/containerd-shim-runc-v2" "$WORK/bin/ctr" \
		"$ROOT/usr/local/bin/"
	install -m 0755 "$VMC_DIR/vmnode" "$ROOT/usr/local/bin/vmnode"
	install -m 0755 "$WORK"/cni-plugins/{bridge,host-local,loopback,multus,whereabouts,static} "$ROOT/opt/cni/bin/"
	cp "$WORK/image/pause-oci.tar" "$WORK/fastpath-image/fastpath.tar" "$WORK/workload-image/workload.tar" "$ROOT/images/"
	install -m 0755 "$VMC_DIR/init" "$ROOT/init"
	mkdir -p "$ROOT/etc/containerd" "$ROOT/etc/cni/net.d/whereabouts.d" "$ROOT/etc/cni/multus/net.d"
	guest_containerd_config >"$ROOT/etc/containerd/config.toml"
	# Multus is the node's CNI, with the cluster's default network (the
	# bridge, written per node by node_join) in its confDir, as in make
	# e2e-cluster; their kubeconfigs come with the node's credentials.
	cat >"$ROOT/etc/cni/net.d/00-multus.conf" <<EOF
{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus",
 "kubeconfig":"/etc/cni/net.d/multus.d/multus.kubeconfig",
 "clusterNetwork":"e2e-pods","confDir":"/etc/cni/multus/net.d","cniDir":"/var/lib/cni/multus","binDir":"/opt/cni/bin",
 "logFile":"/var/log/multus.log","logLevel":"verbose"}
EOF
	cat >"$ROOT/etc/cni/net.d/whereabouts.d/whereabouts.conf" <<EOF
{"datastore":"kubernetes","kubernetes":{"kubeconfig":"/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"},
 "log_file":"/var/log/whereabouts.log","log_level":"debug"}
EOF
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$ROOT/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$ROOT/etc/group"
	echo "nameserver 10.0.2.3" >"$ROOT/etc/resolv.conf"
	echo "127.0.0.1 localhost" >"$ROOT/etc/hosts"
	local m mods=$ROOT/lib/modules/$KERNEL_ABI dep=$KDIR/lib/modules/$KERNEL_ABI/modules.dep
	mkdir -p "$mods"
	for m in $(for m in $MODULES; do
		grep -E "/${m//[-_]/[-_]}\.ko(\.xz|\.zst|\.gz)?:" "$dep" | tr -d ':' | tr ' ' '\n'
	done | sort -u); do
		mkdir -p "$mods/$(dirname "$m")"
		case $m in
		*.xz) xz -dc "$KDIR/lib/modules/$KERNEL_ABI/$m" >"$mods/${m%.xz}" ;;
		*) cp "$KDIR/lib/modules/$KERNEL_ABI/$m" "$mods/$m" ;;
		esac
	done
	cp "$KDIR/lib/modules/$KERNEL_ABI"/modules.{builtin,builtin.modinfo,order} "$mods/" 2>/dev/null || true
	depmod -b "$ROOT" "$KERNEL_ABI"
	(cd "$ROOT" && find . -print0 | cpio --null -o -H newc --quiet) >"$INITRD.tmp"
	mv "$INITRD.tmp" "$INITRD"
	echo "$stamp" >"$INITRD.stamp"
	rm -rf "$ROOT"
	log "initramfs: $(du -m "$INITRD" | cut -f1) MiB"
}

# rdma_tool_paths prints the files of the verbs tools the guests get:
# kernel.sh's (verbs_tool_paths), then rdma's and script's real paths.
rdma_tool_paths() {
	local t
	verbs_tool_paths
	for t in $RDMA_TOOLS; do
		readlink -f "$(type -P "$t")" # type -P: rdma is also a function here
	done
}

# rdma_tools_installed says whether the host has every verbs tool, the
# rxe provider and its driver file.
rdma_tools_installed() {
	local t
	verbs_tool_paths >/dev/null 2>&1 || return 1
	for t in $RDMA_TOOLS; do type -P "$t" >/dev/null || return 1; done
}

# install_rdma_tools installs the verbs tools' packages where missing, as
# make e2e-kernel installs its guest's userland (apt-get, Debian's own).
install_rdma_tools() {
	rdma_tools_installed && return 0
	command -v apt-get >/dev/null || die "no verbs tools for the RDMA bytes on kernel $KERNEL_ABI, and no apt-get to install $RDMA_DEBS"
	log "installing $RDMA_DEBS (the guests' verbs tools)"
	apt-get update -qq || log "apt-get update failed"
	# shellcheck disable=SC2086 # a list of packages
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $RDMA_DEBS >&2 || true
	rdma_tools_installed || die "the verbs tools are still missing after apt-get install $RDMA_DEBS"
}

# ------------------------------------------------------------ the guests

# vm_exec N SCRIPT runs SCRIPT (sh) in node N through its control port and
# prints its output (stdout and stderr); its exit status is the script's,
# 255 when the node did not answer within VM_EXEC_TIMEOUT (120 s).
vm_exec() {
	local n=$1 script=$2 id=$RANDOM$RANDOM line out="" rc="" fd
	{ exec {fd}<>"/dev/tcp/127.0.0.1/$(vm_port "$n")"; } 2>/dev/null || return 255
	printf '%s %s\n' "$id" "$(printf '%s' "$script" | base64 -w0)" >&"$fd"
	while IFS= read -r -t "${VM_EXEC_TIMEOUT:-120}" line <&"$fd"; do
		if [[ $line == "@@END $id "* ]]; then
			rc=${line##* }
			break
		fi
		[[ $line == @@* ]] || out+=$line$'\n'
	done
	exec {fd}>&-
	[[ -n $rc ]] || return 255
	printf '%s' "$out" | base64 -d 2>/dev/null
	return "$rc"
}
vm() { vm_exec "$1" "${*:2}"; }

# vm_put N PATH MODE writes stdin to PATH in node N.
vm_put() {
	local b
	b=$(base64 -w0)
	vm_exec "$1" "mkdir -p '$(dirname "$2")' && echo '$b' | base64 -d >'$2' && chmod $3 '$2'" >/dev/null
}

vm_boot() {
	local n=$1 i wire
	[[ $n == a ]] && i=1 || i=2
	if [[ $n == a ]]; then
		wire="server=on"
	else
		wire="server=off"
	fi
	# no_timer_check, as make e2e-kernel boots: under TCG on a loaded host
	# the kernel's boot-time check that the IO-APIC timer ticks can miss
	# the ticks it waits for and panic (one 7.3 boot there did); the
	# emulated q35's timer works.
	local qemu=(
		qemu-system-x86_64 -accel tcg -cpu max -smp "$VM_CPUS" -m "$VM_MEM"
		-machine q35 -display none -no-reboot -monitor none
		-serial "file:$RUN/logs/vm-$n.console"
		-kernel "$KERNEL_VMLINUZ" -initrd "$INITRD"
		-append "console=ttyS0 panic=-1 no_timer_check loglevel=4 fp_node=$(vm_name "$n")"
		-netdev "stream,id=wire,$wire,addr.type=unix,addr.path=$RUN/wire.sock"
		-device pcie-root-port,id=rp1,chassis=1,slot=1 -device "igb,netdev=wire,bus=rp1,mac=52:54:00:e2:0$i:02"
		-netdev user,id=mgmt -device "virtio-net-pci,netdev=mgmt,mac=52:54:00:e2:0$i:01"
		-device virtio-serial-pci
		-chardev "socket,id=ctl,host=127.0.0.1,port=$(vm_port "$n"),server=on,wait=off"
		-device virtserialport,chardev=ctl,name=ctl
	)
	mkdir -p "$RUN/logs" "$RUN/pids"
	timeout -k 10 "$VM_TIMEOUT" "${qemu[@]}" </dev/null >>"$RUN/logs/vm-$n.log" 2>&1 &
	echo $! >"$RUN/pids/vm-$n"
	date +%s.%N >"$RUN/vm-$n.t0"
	log "started node $n: QEMU (pid $!), TCG, $VM_CPUS vCPU, $VM_MEM MiB"
}

vm_stop() {
	local n=$1 f=$RUN/pids/vm-$1 pid
	[[ -f $f ]] || return 0
	pid=$(<"$f")
	if [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == */timeout ]]; then
		kill -TERM "$pid" 2>/dev/null || true
		local i
		for ((i = 0; i < 40; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.25
		done
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
		log "stopped node $n (pid $pid)"
	fi
	rm -f "$f"
}
vm_running() { [[ -f $RUN/pids/vm-$1 ]] && kill -0 "$(<"$RUN/pids/vm-$1")" 2>/dev/null; }
vm_answers() { [[ $(VM_EXEC_TIMEOUT=10 vm_exec "$1" 'echo ok') == ok ]]; }
# vm_mark N WHAT prints the guest's uptime at its console marker.
vm_mark() { sed -n "s/^VM-NODE $2.* uptime=\([0-9.]*\).*/\1/p" "$RUN/logs/vm-$1.console" | head -1; }
vm_uptime() { vm "$1" "cut -d' ' -f1 /proc/uptime"; }

# ------------------------------------------------------------ joining

# guest_kubeconfig NAME CERT|token:TOKEN prints a kubeconfig for a node's
# component: the API server at the address the guests reach it at, the
# test CA and the credentials inline.
guest_kubeconfig() {
	local user
	if [[ $2 == token:* ]]; then
		user="    token: ${2#token:}"
	else
		user="    client-certificate-data: $(base64 -w0 "$PKI/$2.crt")
    client-key-data: $(base64 -w0 "$PKI/$2.key")"
	fi
	cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: $GUEST_API
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $1
  user:
$user
contexts:
- name: e2e
  context:
    cluster: e2e
    user: $1
current-context: e2e
EOF
}
sa_token() { sed -n 's/^    token: //p' "$KCFG/$1.kubeconfig"; }

# node_join N: the node's credentials (a client certificate of the test
# CA for system:node:NAME, the Multus and whereabouts tokens), its kubelet
# config and default network; then its kubelet, registering the Node.
node_join() {
	local n=$1 name i
	name=$(vm_name "$n")
	[[ $n == a ]] && i=1 || i=2
	cert "kubelet-$n" "system:node:$name" system:nodes
	guest_kubeconfig "$name" "kubelet-$n" | vm_put "$n" /etc/kubernetes/kubelet.kubeconfig 0600
	guest_kubeconfig multus "token:$(sa_token multus)" | vm_put "$n" /etc/cni/net.d/multus.d/multus.kubeconfig 0600
	guest_kubeconfig whereabouts "token:$(sa_token whereabouts)" |
		vm_put "$n" /etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig 0600
	cat <<EOF | vm_put "$n" /etc/cni/multus/net.d/10-pods.conflist 0644
{"cniVersion":"1.0.0","name":"e2e-pods","plugins":[
  {"type":"bridge","bridge":"fpv-br0","isGateway":false,"ipMasq":false,
   "ipam":{"type":"host-local","ranges":[[{"subnet":"10.57.$i.0/24"}]]}}]}
EOF
	{
		CTRD_SOCK=/run/containerd/containerd.sock HEALTHZ_PORT=10248 \
			kubelet_config /var/log/pods /usr/libexec/kubernetes/kubelet-plugins/volume/exec
		cat <<EOF
nodeStatusUpdateFrequency: 2s
EOF
	} | vm_put "$n" /etc/kubernetes/kubelet.yaml 0644
	kubelet_start "$n"
}
kubelet_start() {
	vm "$1" "setsid /usr/local/bin/kubelet --config /etc/kubernetes/kubelet.yaml \
--kubeconfig /etc/kubernetes/kubelet.kubeconfig --root-dir /var/lib/kubelet --cert-dir /var/lib/kubelet/pki \
--hostname-override $(vm_name "$1") --node-ip $GUEST_IP --v=2 >>/var/log/kubelet.log 2>&1 </dev/null &
echo \$! >/run/kubelet.pid" >/dev/null
}
kubelet_stop() {
	vm "$1" 'pid=$(cat /run/kubelet.pid); kill $pid; i=0; while kill -0 $pid 2>/dev/null && [ $i -lt 100 ]; do sleep 0.2; i=$((i+1)); done; ! kill -0 $pid 2>/dev/null'
}
node_ready() { kubectl wait --for condition=Ready --timeout 1s "node/$(vm_name "$1")"; }
kubelet_healthy() { vm "$1" vmnode healthz; }

# ------------------------------------------------------------ helpers

alloc() { kubectl get node "$(vm_name "$1")" -o json | jq -r --arg r "$RESOURCE" '.status.allocatable[$r] // "0"'; }
alloc_is() { [[ $(alloc "$1") == "$2" ]]; }
plugin_pod() {
	kubectl -n "$DS_NS" get pods -l "app.kubernetes.io/name=$DS" --field-selector "spec.nodeName=$(vm_name "$1")" \
		-o jsonpath='{.items[0].metadata.name}' 2>/dev/null
}
plugin_ready() {
	kubectl -n "$DS_NS" get pods -l "app.kubernetes.io/name=$DS" --field-selector "spec.nodeName=$(vm_name "$1")" -o json |
		jq_true '.items | length == 1 and (.[0].metadata.deletionTimestamp == null) and
			any(.[0].status.conditions[]?; .type == "Ready" and .status == "True")'
}
ds_ready_both() {
	kubectl -n "$DS_NS" get ds "$DS" -o json |
		jq_true '.status.desiredNumberScheduled == 2 and .status.numberReady == 2 and .status.updatedNumberScheduled == 2'
}
registrations() { vm "$1" vmnode metric fastpath_device_plugin_registrations_total "'resource=\"$RESOURCE\",result=\"ok\"'"; }
registered_above() { (($(registrations "$1") > $2)); }
seed_pod() { echo "nccl-seed-$1"; }
pod_pid() { vm "$1" vmnode task-pid default "$(seed_pod "$1")" nccl; }
pod_gone() { ! kubectl get pod "$(seed_pod "$1")" >/dev/null 2>&1; }
vfs_of() { vm "$1" vmnode vfs wire0; }
# vf_home N: every VF of node N's PF is in the node's netns under the name
# it had before the pods ($RUN/vfs-N), and the PF's VF settings are as
# they were ($RUN/vf-settings-N).
vf_home() { [[ $(vfs_of "$1") == "$(<"$RUN/vfs-$1")" && $(vm "$1" vmnode vf-settings wire0) == "$(<"$RUN/vf-settings-$1")" ]]; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# ------------------------------------------------------------ the phases

TIMES=()

# vm_pair_boot boots node a (the wire's server end), waits for its
# socket, then node b.
vm_pair_boot() {
	vm_boot a
	wait_for 60 "node a's wire socket" test -S "$RUN/wire.sock" || true
	vm_boot b
}

# vm_reached_init N: node N's /init has written its first line.
vm_reached_init() { grep -q '^VM-NODE init' "$RUN/logs/vm-$1.console" 2>/dev/null; }

# vm_boots_settle waits for both guests' /init; a guest kernel that
# prints nothing for VM_BOOT_WAIT seconds (seen once on 7.3 under TCG
# with both guests booting on a loaded 2-core host: no console line in
# 12 minutes while its QEMU spun at 170% CPU; the other guest reached
# /init in 30 s) is not our software: both guests are booted again, and
# the run says so. Past VM_BOOT_TRIES boots the run fails.
vm_boots_settle() {
	local try n stuck
	for ((try = 1; ; try++)); do
		stuck=()
		for n in "${VM_NODES[@]}"; do
			wait_for "$VM_BOOT_WAIT" "node $n's /init" vm_reached_init "$n" || stuck+=("$n")
		done
		((${#stuck[@]})) || return 0
		if ((try >= VM_BOOT_TRIES)); then
			fail "node ${stuck[*]}: no /init within ${VM_BOOT_WAIT}s of QEMU's start, in each of $try boots"
			exit 1
		fi
		log "node ${stuck[*]}: guest kernel printed nothing and reached no /init within ${VM_BOOT_WAIT}s (boot $try of at most $VM_BOOT_TRIES); both guests booted again"
		BOOT_RETRIES+=("node ${stuck[*]}: boot $try stuck")
		for n in "${VM_NODES[@]}"; do vm_stop "$n"; done
		rm -f "$RUN/wire.sock"
		for n in "${VM_NODES[@]}"; do mv "$RUN/logs/vm-$n.console" "$RUN/logs/vm-$n.console.boot$try" 2>/dev/null || true; done
		vm_pair_boot
	done
}
BOOT_RETRIES=()

nodes_up() {
	phase "two VM nodes: boot, join, Ready"
	local n t
	vm_boots_settle
	for n in "${VM_NODES[@]}"; do
		require "node $n: booted, containerd up, images imported, control port answers" 600 vm_answers "$n"
	done
	for n in "${VM_NODES[@]}"; do
		expect "node $n: images in its containerd (pause, fastpath, workload)" 3 \
			"$(vm "$n" "ctr -n k8s.io images ls -q 'name~=^localhost/fastpath-e2e/' | wc -l" | tr -d ' ')"
		check "node $n: cgroup v2 with the kubelet's controllers delegated" \
			vm "$n" 'for c in cpu memory pids; do grep -qw $c /sys/fs/cgroup/cgroup.subtree_control || exit 1; done'
		check "node $n: its igb PF wire0 has SR-IOV (sriov_totalvfs > 0)" \
			vm "$n" 'test "$(cat /sys/class/net/wire0/device/sriov_totalvfs)" -gt 0'
		vm "$n" 'echo "kubelet-start uptime=$(cut -d" " -f1 /proc/uptime)" >/run/kubelet-start'
		node_join "$n"
	done
	for n in "${VM_NODES[@]}"; do
		require "node $n: kubelet /healthz" 300 kubelet_healthy "$n"
		echo "$(vm_uptime "$n")" >"$RUN/healthz-$n"
		require "node $n: Node $(vm_name "$n") Ready (joined with a client certificate of the test CA)" 300 node_ready "$n"
		echo "$(vm_uptime "$n")" >"$RUN/ready-$n"
	done
	for n in "${VM_NODES[@]}"; do
		t=$(vm "$n" 'sed -n "s/.*uptime=//p" /run/kubelet-start')
		TIMES+=("node $n (guest uptime, s): containerd $(vm_mark "$n" containerd), images $(vm_mark "$n" images), kubelet started $t, healthz $(<"$RUN/healthz-$n"), Node Ready $(<"$RUN/ready-$n") (host polls: ≤ 1 s late)")
	done
}

# deploy: deployments/ as shipped with components/provision, through an
# overlay that sets the image and what the seed's config cannot say about
# these NICs (see README: the pool and the policy select the guests' igb
# VFs, under the seed's resource name, so that the seed's NAD and pod go
# unchanged), and where the API server is (no kube-proxy in the guests).
deploy() {
	phase "the shipped DaemonSet with components/provision on both nodes"
	local dir=$RUN/deploy rel
	mkdir -p "$dir"
	rel=$(realpath --relative-to="$dir" "$REPO/deployments")
	jq -n '{apiVersion: "v1", kind: "ConfigMap", metadata: {name: "fastpath-config", namespace: "fastpath"},
		data: {"config.json": ({periodicUpdateInterval: 300, resourceList: [{resourcePrefix: "mellanox.com",
			resourceName: "mlnx_sriov_rdma", allocationPolicy: "spread",
			selectors: {vendors: ["8086"], devices: ["10ca"], drivers: ["igbvf"]}}]} | tojson)}}' >"$dir/config.json"
	jq -n --arg sel "$POLICY_LABEL" --argjson vfs "$VFS" '{apiVersion: "v1", kind: "ConfigMap",
		metadata: {name: "fastpath-policies", namespace: "fastpath"},
		data: {"policies.yaml": ({apiVersion: "sriovnetwork.openshift.io/v1", kind: "SriovNetworkNodePolicy",
			metadata: {name: "igb-wire", namespace: "sriov-network-operator"},
			spec: {resourceName: "mlnx_sriov_rdma", nodeSelector: {($sel): "true"}, priority: 90, numVfs: $vfs,
				nicSelector: {vendor: "8086", pfNames: ["wire0"]}, deviceType: "netdevice"}} | tojson)}}' >"$dir/policies.json"
	write_overlay "$dir" "$rel" <<EOF
images:
  - name: ghcr.io/fastpath-k8s/fastpath
    newName: ${FASTPATH_IMAGE%:*}
    newTag: "${FASTPATH_IMAGE##*:}"
components: [$rel/components/provision]
patches:
  - path: config.json
  - path: policies.json
  - target: {kind: DaemonSet, name: $DS}
    patch: |-
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_HOST, value: "$GUEST_HOST"}}
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}}
EOF
	kubectl kustomize "$dir" >"$RUN/deploy.yaml"
	check "the overlay keeps the shipped DaemonSet's securityContext and its hostPaths /sys, /dev" \
		jq_true -s '[.[] | select(.kind == "DaemonSet")][0].spec.template.spec | (.volumes | map(.hostPath.path // empty) | index("/sys") != null and index("/dev") != null and index("/sys/devices") != null)
			and .containers[0].securityContext.capabilities.drop == ["ALL"] and .containers[0].securityContext.capabilities.add == ["NET_ADMIN"] and .containers[0].securityContext.privileged == false' \
		< <(kubectl create --dry-run=client -o json -f "$RUN/deploy.yaml" 2>/dev/null)
	# Node B's VFs, by hand, before the plugin starts.
	check "node b: $VFS VFs made by hand (echo $VFS > sriov_numvfs)" \
		vm b "echo $VFS >/sys/class/net/wire0/device/sriov_numvfs"
	kubectl label node "$(vm_name a)" "$NFD_LABEL=true" "$POLICY_LABEL=true" >/dev/null
	kubectl label node "$(vm_name b)" "$NFD_LABEL=true" >/dev/null
	check "kubectl apply -k of the overlay" kubectl apply -k "$dir"
	local t0
	t0=$(date +%s.%N)
	require "DaemonSet $DS_NS/$DS Ready on both nodes" 600 ds_ready_both
	TIMES+=("DaemonSet Ready on both nodes: $(elapsed "$t0") s after kubectl apply")
	require "node a: the policy's $VFS VFs made by the plugin and served (allocatable $RESOURCE)" 300 alloc_is a "$VFS"
	require "node b: its $VFS hand-made VFs served (allocatable $RESOURCE)" 120 alloc_is b "$VFS"
	local n
	for n in "${VM_NODES[@]}"; do
		check "node $n: the init container installed /opt/cni/bin/sriov (answers CNI VERSION)" \
			vm "$n" 'CNI_COMMAND=VERSION /opt/cni/bin/sriov </dev/null | grep -q 0.3.1'
		check "node $n: $VFS igbvf VFs on wire0, each with its netdev in the node's netns" \
			test "$(vfs_of "$n" | awk '$2 != "-"' | wc -l)" = "$VFS"
		vfs_of "$n" >"$RUN/vfs-$n"
		vm "$n" vmnode vf-settings wire0 >"$RUN/vf-settings-$n"
		expect "node $n: device plugin registrations with the kubelet" 1 "$(registrations "$n")"
	done
	expect "node a: sriov_numvfs written by the plugin (the policy)" "$VFS" "$(vm a cat /sys/class/net/wire0/device/sriov_numvfs)"
}

# seed: the seed's NAD, and its training pod once per node (its name with
# the node's letter, a nodeSelector for the node), the image replaced.
seed() {
	phase "the seed's NAD and training pod, one per node, across the wire"
	local dir=$RUN/seed n
	mkdir -p "$dir/files"
	cp "$CLUSTER_DIR/seed/sriov-net-ib.yaml" "$dir/files/"
	for n in "${VM_NODES[@]}"; do
		mkdir -p "$dir/$n"
		cp "$CLUSTER_DIR/seed/training-pod.yaml" "$dir/$n/"
		write_overlay "$dir/$n" training-pod.yaml <<EOF
nameSuffix: -$n
images:
  - name: nvcr.io/nvidia/pytorch
    newName: ${WORKLOAD_IMAGE%:*}
    newTag: "${WORKLOAD_IMAGE##*:}"
patches:
  - target: {kind: Pod}
    patch: |-
      - {op: add, path: /spec/nodeSelector, value: {kubernetes.io/hostname: $(vm_name "$n")}}
EOF
	done
	write_overlay "$dir" files/sriov-net-ib.yaml a b <<<"namespace: default"
	local t0
	t0=$(date +%s.%N)
	check "kubectl apply -k of the seed's NAD and two training pods" kubectl apply -k "$dir"
	for n in "${VM_NODES[@]}"; do
		require "pod $(seed_pod "$n") Running on $(vm_name "$n")" 600 pod_running default "$(seed_pod "$n")"
		TIMES+=("pod $(seed_pod "$n") Running: $(elapsed "$t0") s after kubectl apply (both pods applied at once)")
	done
	local addrs=() pid vf mac addr status pf
	for n in "${VM_NODES[@]}"; do
		local pod
		pod=$(seed_pod "$n")
		expect "$pod: on $(vm_name "$n")" "$(vm_name "$n")" "$(kubectl get pod "$pod" -o jsonpath='{.spec.nodeName}')"
		pid=$(pod_pid "$n") || true
		vf=$(vm "$n" vmnode env "$pid" "$RESOURCE_ENV")
		check "$pod: $RESOURCE_ENV names a VF of its node's PF wire0 ($vf)" \
			bash -c "[[ -n '$vf' ]] && grep -q '^$vf ' '$RUN/vfs-$n'"
		read -r pf mac addr <<<"$(vm "$n" vmnode net1 "$pid")"
		expect "$pod: net1 in the container is that VF (its sysfs device)" "$vf" "$pf"
		check "$pod: net1 has a whereabouts address in $RANGE ($addr)" matches "$addr" '^192\.168\.2\.[0-9]+/24$'
		check "$pod: the VF's netdev left the node's netns" \
			bash -c "[[ \$(grep '^$vf ' <<<\"\$1\") == '$vf -' ]]" _ "$(vfs_of "$n")"
		status=$(kubectl get pod "$pod" -o json | jq -r '.metadata.annotations["k8s.v1.cni.cncf.io/network-status"] // "[]"')
		check "$pod: network-status says what the container sees: net1, default/$NAD, $addr, $mac, device-info pci-address $vf" \
			jq_true --arg ip "${addr%/*}" --arg mac "$mac" --arg vf "$vf" --arg nad "default/$NAD" \
			'any(.[]; .interface == "net1" and .name == $nad and (.ips | index($ip)) and .mac == $mac
				and .["device-info"].pci["pci-address"] == $vf)' <<<"$status"
		addrs+=("${addr%/*}")
		echo "$vf $mac $addr" >"$RUN/pod-$n"
	done
	check "the two pods' addresses are distinct, from one range (${addrs[*]})" test "${addrs[0]}" != "${addrs[1]:-}"
	expect "whereabouts IPPool $RANGE holds both pods" "default/$(seed_pod a) default/$(seed_pod b)" "$(ippool_pods "$RANGE" | xargs)"
	ping_across "${addrs[@]}"
}

# ping_across ADDR_A ADDR_B: each pod pings the other over net1, VF to VF
# across the wire.
ping_across() {
	local n
	for n in "${VM_NODES[@]}"; do
		wait_for 60 "pod $n: net1 has carrier (igbvf's link comes up a moment after it moves)" net1_carrier "$n" || true
	done
	check "traffic across the nodes: pod a (net1, VF on a's PF) pings pod b's $2 over the wire" \
		vm a "nsenter -t \$(vmnode task-pid default $(seed_pod a) nccl) -n ping -c 3 -W 5 -I net1 $2"
	check "traffic across the nodes: pod b pings pod a's $1" \
		vm b "nsenter -t \$(vmnode task-pid default $(seed_pod b) nccl) -n ping -c 3 -W 5 -I net1 $1"
}

net1_carrier() { [[ $(vm "$1" "cat /proc/\$(vmnode task-pid default $(seed_pod "$1") nccl)/root/sys/class/net/net1/carrier") == 1 ]]; }
# keeps_vf N: pod N still has its VF as net1 with its address.
keeps_vf() { [[ $(vm "$1" vmnode net1 "$(pod_pid "$1")") == "$(<"$RUN/pod-$1")" ]]; }

life() {
	phase "the node's life: kubelet restart, plugin pod deleted, pods deleted"
	local before
	before=$(registrations b)
	check "node b: kubelet stopped" kubelet_stop b
	kubelet_start b
	require "node b: kubelet /healthz after its restart" 300 kubelet_healthy b
	require "node b: the plugin re-registered (registrations > $before)" 300 registered_above b "$before"
	require "node b: allocatable $RESOURCE = $VFS after the kubelet restart" 120 alloc_is b "$VFS"
	check "node b: pod b kept its VF, net1 and address across the kubelet restart" keeps_vf b
	local old
	old=$(plugin_pod a)
	check "node a: plugin pod $old deleted" kubectl -n "$DS_NS" delete pod "$old" --wait=true --timeout 120s
	require "node a: a new plugin pod Ready" 300 plugin_ready a
	require "node a: allocatable $RESOURCE = $VFS after the plugin's restart" 120 alloc_is a "$VFS"
	expect "node a: sriov_numvfs kept by the restarted plugin (a VF is in use)" "$VFS" "$(vm a cat /sys/class/net/wire0/device/sriov_numvfs)"
	check "node a: pod a kept its VF, net1 and address across the plugin's restart" keeps_vf a
	ping_across "$(awk '{ sub(/\/.*/, "", $3); print $3 }' "$RUN/pod-a")" "$(awk '{ sub(/\/.*/, "", $3); print $3 }' "$RUN/pod-b")"
	local n
	for n in b a; do
		check "pod $(seed_pod "$n") deleted" kubectl delete pod "$(seed_pod "$n")" --grace-period 1 --wait=true --timeout 180s
		require "node $n: its VFs back in the node's netns under their own names, the PF's VF settings as found" 120 vf_home "$n"
		require "node $n: allocatable $RESOURCE = $VFS with its pod gone" 60 alloc_is "$n" "$VFS"
	done
	if rdma_kernel; then
		# rdma made an rxe device over each pod's VF: it goes with the
		# VF's netdev when the CNI takes it out of the pod's netns
		for n in "${VM_NODES[@]}"; do
			if wait_for 60 "node $n: no $RXE left" rxe_gone "$n"; then
				pass "node $n: no rxe device left with its pod gone (rdma link show in the node)"
			else
				fail "node $n: an rxe device left with its pod gone: $(vm "$n" /usr/bin/rdma link show 2>&1 | oneline)"
			fi
		done
	fi
	expect "whereabouts IPPool $RANGE empty with the job gone" "" "$(ippool_pods "$RANGE" | xargs)"
	for n in "${VM_NODES[@]}"; do
		# Its tombstones (deleted-*.json: a DEL that found nothing) are no state.
		expect "node $n: no sriov CNI state left" "" "$(vm "$n" 'ls -A /var/lib/cni/sriov 2>/dev/null | grep -v "^deleted-.*\.json$" | xargs')"
	done
}

# ------------------------------------------------------------ RDMA bytes

# The seed's pods have no verbs tools (the workload image is minimal), so
# each tool runs from its node's root (the initramfs has them:
# make_initramfs) by nsenter into the pod sandbox's network namespace, as
# a debug container would: in_pod N CMD runs CMD (sh) in node N with pod
# N's netns, the node's mounts (its /sys, and /dev with the uverbs and
# rdma_cm devices). What the netns decides (which netdevs, addresses and
# UDP sockets rxe and rdma_cm see) is the pod's.
in_pod() { vm "$1" "nsenter -t $(pod_pid "$1") -n $2"; }
# on_pty CMD: CMD under util-linux's script, on a pty, so that a tool's
# output comes line by line (a pipe would keep what a tool that timeout
# kills had printed); its exit status is CMD's.
on_pty() { echo "/usr/bin/script -q -e -f -c '$1' /dev/null"; }
pod_ip() { awk '{ sub(/\/.*/, "", $3); print $3 }' "$RUN/pod-$1"; }
# oneline [N]: stdin on one line, its first N characters (1500).
oneline() { tr -d '\r' | tr -s '\n\t ' '   ' | cut -c1-"${1:-1500}"; }
rxe_active() { in_pod "$1" "/usr/bin/rdma link show $RXE/1" | grep -q "state ACTIVE .*netdev net1"; }
rxe_gone() {
	local out
	out=$(vm "$1" "/usr/bin/rdma link show") || return 1
	! grep -q "link $RXE/" <<<"$out"
}
# rxe_state N: what node N's rxe device shows when a tool fails: its QPs
# and its non-zero counters.
rxe_state() {
	vm "$1" "echo QPs: \$(/usr/bin/rdma resource show qp link $RXE/1); echo counters: \$(vmnode rxe-counters $RXE)" | oneline
}

# rdma_pair NAME LIMIT SERVER CLIENT runs SERVER in pod a (in the
# background in node a) and CLIENT in pod b, the client again while it
# cannot connect yet (the server needs a moment to listen), each under
# timeout LIMIT (s); then waits for the server's end. RDMA_SOUT and
# RDMA_COUT are their outputs, the client's last attempt's ($RUN/logs/
# rdma-NAME.log has every attempt); it fails unless both exit 0.
rdma_pair() {
	local name=$1 limit=$2 srv=$3 cli=$4 log=/tmp/rdma-$1 crc=1 src deadline tries=0 earlier=""
	RDMA_SOUT="" RDMA_COUT=""
	vm a "rm -f $log.out $log.rc; setsid sh -c \"nsenter -t $(pod_pid a) -n $(on_pty "timeout $limit $srv") >$log.out 2>&1; echo \\\$? >$log.rc\" </dev/null >/dev/null 2>&1 &" >/dev/null
	deadline=$((SECONDS + limit))
	while true; do
		[[ -z $RDMA_COUT ]] || earlier+="attempt $tries, exit status $crc:"$'\n'"$RDMA_COUT"$'\n'
		tries=$((tries + 1))
		RDMA_COUT=$(in_pod b "$(on_pty "timeout $limit $cli")" 2>&1) && crc=0 || crc=$?
		((crc != 0)) || break
		vm a "test -f $log.rc" && break # the server ended
		((SECONDS < deadline)) || break
		sleep 1
	done
	wait_for $((limit + 15)) "rdma $name: the server in pod a ended" vm a "test -f $log.rc" || true
	src=$(vm a "cat $log.rc 2>/dev/null || echo none") || src=none
	RDMA_SOUT=$(vm a "cat $log.out" | tr -d '\r') || true
	RDMA_COUT=$(tr -d '\r' <<<"$RDMA_COUT")
	printf '%s server (pod a), exit status %s:\n%s\n%s client (pod b), attempt %s, exit status %s:\n%s\nearlier attempts (the server not listening yet):\n%s' \
		"$name" "$src" "$RDMA_SOUT" "$name" "$tries" "$crc" "$RDMA_COUT" "$(tr -d '\r' <<<"$earlier")" >"$RUN/logs/rdma-$name.log"
	((crc == 0)) && [[ $src == 0 ]]
}
# rdma_failed WHAT: a FAIL with both tools' output and the rxe devices'
# QPs and counters.
rdma_failed() {
	fail "$1: server (pod a): $(oneline 1200 <<<"$RDMA_SOUT"); client (pod b): $(oneline 1200 <<<"$RDMA_COUT"); node a $RXE: $(rxe_state a); node b $RXE: $(rxe_state b) (whole logs: $RUN/logs/rdma-$2.log)"
}

# pingpong_gid OUT SIDE prints the GID ibv_rc_pingpong printed for its
# local or remote address (::ffff:a.b.c.d for an IPv4 RoCE GID).
pingpong_gid() { sed -n "s/.*$2 address:.* GID \([0-9a-fA-F:.]*\).*/\1/p" <<<"$1" | head -1; }
# perftest_gid OUT SIDE prints perftest's GID of its local or remote
# address (16 decimal bytes, the line after the address) in the same form.
perftest_gid() {
	awk -v side="$2 address:" 'index($0, side) { getline; if ($1 != "GID:") exit; n = split($2, b, ":")
		if (n != 16) { print $2; exit }
		pre = ""; for (i = 1; i <= 12; i++) pre = pre (b[i] + 0) ","
		if (pre == "0,0,0,0,0,0,0,0,0,0,255,255,") printf "::ffff:%d.%d.%d.%d\n", b[13], b[14], b[15], b[16]; else print $2
		exit }' <<<"$1"
}
# gids_ok OUT FORMAT LOCAL REMOTE: the local and remote GIDs a tool printed
# are the pods' own IPv4 RoCE GIDs (::ffff:LOCAL, ::ffff:REMOTE).
gids_ok() { [[ $("$2" "$1" local) == "::ffff:$3" && $("$2" "$1" remote) == "::ffff:$4" ]]; }

# rdma: RDMA bytes between the seed's two pods, across the wire: in each
# pod's netns a soft-RoCE device over its VF (net1), then rdma-core's RC
# ping-pong on the pods' RoCE v2 IPv4 GIDs and perftest's RDMA write
# bandwidth with the connection made by rdma_cm (ib_write_bw -R), pod a
# serving, pod b the client. Sizes are small: under TCG make e2e-kernel
# measured 0.7-6 Mbit/s and 1-3 MB/s. The pods keep their rxe devices:
# life deletes the pods, and then none may be left on either node.
rdma() {
	phase "RDMA across the nodes: soft-RoCE in each pod's netns over its VF, ibv_rc_pingpong and ib_write_bw -R"
	if ! rdma_kernel; then
		skip "RDMA across nodes: kernel $KERNEL_ABI's rdma_rxe is not netns-aware (an rxe device on a VF moved into a pod stays in the node's netns); needs a 7.x kernel (KERNEL=7.3)"
		return 0
	fi
	local n pod ip out ok=1 port
	declare -A gid
	port=$(printf ':%04X ' "$ROCE_PORT")
	for n in "${VM_NODES[@]}"; do
		pod=$(seed_pod "$n")
		ip=$(pod_ip "$n")
		if ! out=$(vm "$n" "modprobe -a $RXE_MODULES 2>&1"); then
			fail "node $n: modprobe $RXE_MODULES: $(oneline <<<"$out")"
			ok=""
			continue
		fi
		if ! out=$(in_pod "$n" "timeout 30 /usr/bin/rdma link add $RXE type rxe netdev net1 2>&1"); then
			fail "$pod: rdma link add $RXE type rxe netdev net1 in its netns: $(oneline <<<"$out")"
			ok=""
			continue
		fi
		if wait_for 30 "$pod: $RXE ACTIVE" rxe_active "$n"; then
			pass "$pod: soft-RoCE $RXE made in its netns over net1 (its VF), ACTIVE"
		else
			fail "$pod: $RXE over net1 not ACTIVE within 30s: $(in_pod "$n" "/usr/bin/rdma link show" 2>&1 | oneline)"
			ok=""
			continue
		fi
		# netns-aware rdma_rxe: its UDP socket is in the netdev's netns
		check "$pod: $RXE's UDP socket (port $ROCE_PORT) in the pod's netns" \
			in_pod "$n" "grep -qi '$port' /proc/net/udp /proc/net/udp6"
		if gid[$n]=$(vm "$n" "vmnode rxe-gid $RXE $ip" 2>&1); then
			pass "$pod: $RXE's RoCE v2 GID ::ffff:$ip (the pod's own net1 address) at index ${gid[$n]}"
		else
			fail "$pod: $RXE has no RoCE v2 GID ::ffff:$ip: $(oneline <<<"${gid[$n]}")"
			ok=""
		fi
	done
	local ipa ipb
	ipa=$(pod_ip a)
	ipb=$(pod_ip b)
	if [[ -z $ok ]]; then
		fail "RDMA bytes across the nodes not run: the soft-RoCE devices are not both up (above)"
		return 0
	fi
	# 100 round trips of 4 KiB (ibv_rc_pingpong's size)
	local mbit
	if ! rdma_pair rc-pingpong 60 "/usr/bin/ibv_rc_pingpong -d $RXE -g ${gid[a]} -n 100" \
		"/usr/bin/ibv_rc_pingpong -d $RXE -g ${gid[b]} -n 100 $ipa"; then
		rdma_failed "ibv_rc_pingpong from pod b ($RXE, GID index ${gid[b]}) to pod a ($ipa, GID index ${gid[a]})" rc-pingpong
	elif ! gids_ok "$RDMA_COUT" pingpong_gid "$ipb" "$ipa" || ! gids_ok "$RDMA_SOUT" pingpong_gid "$ipa" "$ipb"; then
		rdma_failed "ibv_rc_pingpong: the GIDs used are not the pods' own IPv4 RoCE GIDs (client local $(pingpong_gid "$RDMA_COUT" local), remote $(pingpong_gid "$RDMA_COUT" remote); want ::ffff:$ipb, ::ffff:$ipa)" rc-pingpong
	elif ! mbit=$(sed -n 's/.* bytes in [0-9.]* seconds = \([0-9.]*\) Mbit\/sec.*/\1/p' <<<"$RDMA_COUT" | head -1) || [[ -z $mbit ]]; then
		rdma_failed "ibv_rc_pingpong's client printed no rate" rc-pingpong
	else
		pass "ibv_rc_pingpong across the nodes, pod b -> pod a over their VFs: $mbit Mbit/s ($(sed -n 's/^\([0-9]* bytes in [0-9.]* seconds\).*/\1/p' <<<"$RDMA_COUT" | head -1); GIDs ::ffff:$ipb -> ::ffff:$ipa, indexes ${gid[b]} and ${gid[a]})"
		TIMES+=("RDMA across the nodes: ibv_rc_pingpong $mbit Mbit/s (100 x 4 KiB)")
	fi
	# 50 writes of 64 KiB. -u 20: RC's ACK timeout 4.3 s (make e2e-kernel:
	# a guest stalled under load longer than the default 67 ms x 7 retries).
	local args="/usr/bin/ib_write_bw -R -F -s 65536 -n 50 -u 20 -d $RXE" line peak avg
	if ! rdma_pair write-bw 90 "$args" "$args $ipa"; then
		rdma_failed "ib_write_bw -R from pod b to pod a ($ipa, rdma_cm)" write-bw
	elif ! gids_ok "$RDMA_COUT" perftest_gid "$ipb" "$ipa"; then
		rdma_failed "ib_write_bw -R: the GIDs rdma_cm picked are not the pods' own IPv4 RoCE GIDs (client local $(perftest_gid "$RDMA_COUT" local), remote $(perftest_gid "$RDMA_COUT" remote); want ::ffff:$ipb, ::ffff:$ipa)" write-bw
	elif ! line=$(awk 'NF == 5 && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { l = $0 } END { if (l == "") exit 1; print l }' <<<"$RDMA_COUT"); then
		rdma_failed "ib_write_bw's client printed no bandwidth" write-bw
	else
		read -r _ _ peak avg _ <<<"$line"
		pass "ib_write_bw -R across the nodes, pod b -> pod a over their VFs: $avg MB/s average, $peak MB/s peak (50 writes of 64 KiB; rdma_cm picked GIDs ::ffff:$ipb -> ::ffff:$ipa)"
		TIMES+=("RDMA across the nodes: ib_write_bw -R $avg MB/s average (50 x 64 KiB)")
	fi
}

# ------------------------------------------------------------ run

preflight() {
	if ((EUID != 0)); then
		echo "SKIPPED: make e2e-vm-cluster needs root (QEMU guests, the control plane's ports)." >&2
		exit 0
	fi
	command -v qemu-system-x86_64 >/dev/null || { echo "SKIP: no qemu-system-x86_64 (make e2e-kernel installs QEMU >= 8.0 from bookworm-backports)"; exit 0; }
	qemu-system-x86_64 -device help 2>/dev/null | grep -q '"igb"' || { echo "SKIP: this QEMU has no -device igb (needs >= 8.0)"; exit 0; }
	local missing=() t
	for t in runc ip curl jq openssl cpio depmod busybox base64 timeout; do
		command -v "$t" >/dev/null || missing+=("$t")
	done
	((${#missing[@]} == 0)) || die "missing tools: ${missing[*]} (Debian: apt-get install runc iproute2 curl jq openssl cpio kmod busybox-static)"
	if rdma_kernel; then install_rdma_tools; fi
	local p
	for p in $ETCD_PORT $ETCD_PEER_PORT $API_PORT $KCM_PORT $SCHED_PORT $VM_CTL_PORT_a $VM_CTL_PORT_b; do
		if (: <"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then die "port $p is in use on 127.0.0.1 (make e2e-cluster running?)"; fi
	done
}

cleanup_vm() {
	set +e
	local n p
	for n in "${VM_NODES[@]}"; do vm_stop "$n"; done
	for p in kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$p"; done
	rm -rf "$RUN/etcd" "$RUN/wire.sock"
	set -e
}

on_exit_vm() {
	local rc=$? left="" p
	trap - EXIT INT TERM
	log "cleaning up"
	cleanup_vm
	for p in vm-a vm-b kube-scheduler kube-controller-manager kube-apiserver etcd; do
		[[ -f $RUN/pids/$p ]] && left+=" $p"
	done
	check "no process of the run left (QEMU, control plane)" test -z "$left"
	((rc == 0)) || fail "the run stopped early (exit status $rc)"
	local t
	summary
	echo "timings:"
	for t in "${TIMES[@]}"; do echo "  $t"; done
	((${#BOOT_RETRIES[@]} == 0)) || echo "guest boots repeated: ${BOOT_RETRIES[*]}"
	((FAILED == 0)) || exit 1
}

SUMMARY_TITLE="fastpath e2e-vm-cluster (two QEMU nodes, kernel $KERNEL_ABI, Kubernetes $K8S_VERSION, containerd $CONTAINERD_VERSION, Multus $MULTUS_VERSION, whereabouts $WHEREABOUTS_VERSION)"

main() {
	local t0
	t0=$(date +%s.%N)
	preflight
	"$CLUSTER_DIR/build.sh"
	kernel_dir || { echo "SKIP: cannot fetch the guest kernel linux-image-$KERNEL_ABI"; exit 0; }
	make_initramfs
	log "build step: $(elapsed "$t0")s"
	t0=$(date +%s.%N)
	rm -rf "$RUN"
	mkdir -p "$RUN/logs"
	trap on_exit_vm EXIT
	trap 'exit 130' INT TERM
	# The guests boot while the control plane starts (they need it only
	# when their kubelets start).
	vm_pair_boot
	make_pki
	start_etcd
	start_apiserver
	start_controllers
	setup_cni_identities
	nodes_up
	deploy
	seed
	rdma
	life
	log "test steps done in $(elapsed "$t0")s"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then main "$@"; fi
