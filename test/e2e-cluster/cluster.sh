# shellcheck shell=bash
# Bring-up of the one-node cluster (sourced by run.sh): certificates and
# kubeconfigs, etcd, the API server, controller-manager and scheduler,
# containerd with Multus as its CNI, the kubelet registered as a Node.
# Everything listens on 127.0.0.1 only, on ports preflight checks are free,
# but the API server: it listens on the host's address on the node network
# ($API_HOST, a bridge with no port but the two-node phase's nodes), where
# the nodes' kubelets and pods reach it as the host's do. make
# e2e-vm-cluster sets API_HOST (127.0.0.1, where QEMU's user-mode
# networking takes the guests' 10.0.2.2), API_ADVERTISE and API_EXTRA_SANS
# (more subjectAltNames of the serving certificate) after sourcing this.

PKI=$RUN/pki
KCFG=$RUN/kubeconfig
C=$RUN/containerd
CTRD_SOCK=$C/containerd.sock
K=/var/lib/kubelet # the kubelet's root dir: Multus reads pod-resources/kubelet.sock there, whatever the config says
PODRES_SOCK=$K/pod-resources/kubelet.sock
DP_DIR=$K/device-plugins
NODE=fastpath-e2e
ETCD_PORT=12379
ETCD_PEER_PORT=12380
API_PORT=16443
API_HOST=10.58.0.1 # on the node network's bridge (nodes.sh), made before the API server starts
KCM_PORT=10357
SCHED_PORT=10359
HEALTHZ_PORT=10348
# The DaemonSet's --metrics-addr port, on the host network.
METRICS_PORT=$(sed -n 's/.*--metrics-addr=.*:\([0-9]*\)$/\1/p' "$REPO/deployments/20-daemonset.yaml")
API=https://$API_HOST:$API_PORT
CNI_CONF=$RUN/cni/net.d
CNI_BIN=$RUN/cni/bin
POD_SUBNET=10.57.0.0/24
POD_BRIDGE=fpc-br0
SERVICE_RANGE=10.96.0.0/24

kubectl() { "$WORK/bin/kubectl" --kubeconfig "$KCFG/admin.kubeconfig" "$@"; }
ctr() { "$WORK/bin/ctr" --address "$CTRD_SOCK" --namespace k8s.io "$@" 2>>"$RUN/logs/ctr.log"; }
podres() { "$WORK/bin/podres" --socket "$PODRES_SOCK" "$@"; }

# ------------------------------------------------------------ certificates

# cert NAME CN [O] [SAN] [USAGE] signs NAME.crt/NAME.key with the test CA:
# an EC P-256 key, valid for a day.
cert() {
	local name=$1 cn=$2 o=${3:-} san=${4:-} usage=${5:-clientAuth} subj ext
	subj="/CN=$cn${o:+/O=$o}"
	ext="keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=$usage${san:+
subjectAltName=$san}"
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
		-keyout "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
	openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 1 -extfile <(echo "$ext") -out "$PKI/$name.crt" 2>/dev/null
	rm -f "$PKI/$name.csr"
}

# kubeconfig NAME CERT|token:TOKEN writes $KCFG/NAME.kubeconfig for the API
# server, with a client certificate of the test CA or a bearer token.
kubeconfig() {
	local name=$1 cred=$2 user
	if [[ $cred == token:* ]]; then
		user="    token: ${cred#token:}"
	else
		user="    client-certificate: $PKI/$cred.crt
    client-key: $PKI/$cred.key"
	fi
	cat >"$KCFG/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: $API
    certificate-authority: $PKI/ca.crt
users:
- name: $name
  user:
$user
contexts:
- name: e2e
  context:
    cluster: e2e
    user: $name
current-context: e2e
EOF
}

make_pki() {
	mkdir -p "$PKI" "$KCFG"
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
		-keyout "$PKI/ca.key" -out "$PKI/ca.crt" -subj "/CN=fastpath-e2e-ca" 2>/dev/null
	cert apiserver kube-apiserver "" \
		"IP:127.0.0.1,IP:$API_HOST,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc${API_EXTRA_SANS:+,$API_EXTRA_SANS}" serverAuth
	cert admin kubernetes-admin system:masters
	cert controller-manager system:kube-controller-manager
	cert scheduler system:kube-scheduler
	cert kubelet "system:node:$NODE" system:nodes
	# Service account tokens are signed with this key (ES256).
	openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key" 2>/dev/null
	openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
	chmod 0600 "$PKI"/*.key
	local n
	for n in admin controller-manager scheduler kubelet; do kubeconfig "$n" "$n"; done
	log "certificates and kubeconfigs in $PKI, $KCFG"
}

# ------------------------------------------------------------ control plane

start_etcd() {
	start etcd "$WORK/bin/etcd" --name e2e --data-dir "$RUN/etcd" \
		--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-cluster "e2e=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync --log-level warn
	require "etcd healthy" 60 curl -sf "http://127.0.0.1:$ETCD_PORT/health"
}

start_apiserver() {
	# --endpoint-reconciler-type=none: the kubernetes Service's endpoint
	# would be the API server's address; nothing here uses it.
	start kube-apiserver "$WORK/bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
		--bind-address "$API_HOST" --advertise-address "${API_ADVERTISE:-$API_HOST}" --secure-port "$API_PORT" \
		--cert-dir "$RUN/apiserver" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
		--client-ca-file "$PKI/ca.crt" --authorization-mode Node,RBAC \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
		--service-cluster-ip-range "$SERVICE_RANGE" --endpoint-reconciler-type none --profiling=false
	require "kube-apiserver ready (/readyz)" 120 kubectl get --raw /readyz
}

start_controllers() {
	start kube-controller-manager "$WORK/bin/kube-controller-manager" \
		--kubeconfig "$KCFG/controller-manager.kubeconfig" \
		--authentication-kubeconfig "$KCFG/controller-manager.kubeconfig" \
		--authorization-kubeconfig "$KCFG/controller-manager.kubeconfig" \
		--bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
		--service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
		--use-service-account-credentials
	start kube-scheduler "$WORK/bin/kube-scheduler" --kubeconfig "$KCFG/scheduler.kubeconfig" \
		--authentication-kubeconfig "$KCFG/scheduler.kubeconfig" \
		--authorization-kubeconfig "$KCFG/scheduler.kubeconfig" \
		--bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false
	require "kube-controller-manager healthy" 60 curl -sfk "https://127.0.0.1:$KCM_PORT/healthz"
	require "kube-scheduler healthy" 60 curl -sfk "https://127.0.0.1:$SCHED_PORT/healthz"
	# Pods need their namespace's default ServiceAccount (the controller-manager makes it).
	require "default ServiceAccount in default" 60 kubectl -n default get serviceaccount default
}

# setup_cni_identities applies the CRDs the networks need and gives Multus
# and whereabouts ServiceAccount tokens, as their DaemonSets would.
setup_cni_identities() {
	kubectl apply -f "$WORK/crds/" >/dev/null
	require "NetworkAttachmentDefinition and whereabouts CRDs established" 60 \
		kubectl wait --for condition=established --timeout 1s \
		crd/network-attachment-definitions.k8s.cni.cncf.io crd/ippools.whereabouts.cni.cncf.io
	kubectl apply -f "$CLUSTER_DIR/cluster.yaml" >/dev/null
	local sa
	for sa in multus whereabouts; do
		kubeconfig "$sa" "token:$(kubectl -n kube-system create token "$sa" --duration 2h)"
	done
}

# ------------------------------------------------------------- the node

# write_cni_conf: Multus (thin plugin) is the node's CNI; the cluster's
# default network, which it delegates to, is the reference bridge with no
# gateway (so that the bridge plugin never turns on ip_forward) and no
# masquerade (no iptables rules). Multus finds it by name in its confDir: a
# clusterNetwork given as a .conflist path is cached without the plugins'
# own fields, and its DEL then fails (bridge: "no IP ranges specified").
# whereabouts finds its kubeconfig through
# the flat file its DaemonSet would install, /etc/cni/net.d/whereabouts.d.
write_cni_conf() {
	mkdir -p "$CNI_CONF" "$CNI_BIN" "$RUN/cni/default" "$RUN/cni/ipam"
	ln -s "$WORK"/cni-plugins/* "$CNI_BIN/"
	# The DaemonSet's init container installs /opt/cni/bin/sriov; Multus and
	# containerd look for plugins here.
	ln -s /opt/cni/bin/sriov "$CNI_BIN/sriov"
	cat >"$RUN/cni/default/10-pods.conflist" <<EOF
{"cniVersion":"1.0.0","name":"e2e-pods","plugins":[
  {"type":"bridge","bridge":"$POD_BRIDGE","isGateway":false,"ipMasq":false,
   "ipam":{"type":"host-local","ranges":[[{"subnet":"$POD_SUBNET"}]],"dataDir":"$RUN/cni/ipam"}}]}
EOF
	cat >"$CNI_CONF/00-multus.conf" <<EOF
{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus",
 "kubeconfig":"$KCFG/multus.kubeconfig",
 "clusterNetwork":"e2e-pods","confDir":"$RUN/cni/default","cniDir":"$RUN/cni/multus","binDir":"$CNI_BIN",
 "logFile":"$RUN/logs/multus.log","logLevel":"verbose"}
EOF
	mkdir -p /etc/cni/net.d/whereabouts.d
	cat >/etc/cni/net.d/whereabouts.d/whereabouts.conf <<EOF
{"datastore":"kubernetes","kubernetes":{"kubeconfig":"$KCFG/whereabouts.kubeconfig"},
 "log_file":"$RUN/logs/whereabouts.log","log_level":"debug"}
EOF
}

# start_containerd: as make e2e's (test/e2e/lib.sh), with Multus' CNI
# directories, and the pause, fastpath and workload images.
start_containerd() {
	start_containerd_with "$CNI_BIN" "$CNI_CONF"
	local img
	for img in "$WORK/image/pause-oci.tar" "$WORK/fastpath-image/fastpath.tar" "$WORK/workload-image/workload.tar"; do
		ctr images import --all-platforms "$img" >/dev/null
	done
	check "images imported into containerd: pause, $FASTPATH_IMAGE, $WORKLOAD_IMAGE" \
		ctr images check "name~=^localhost/fastpath-e2e/"
	expect "images in containerd" 3 "$(ctr images ls -q 'name~=^localhost/fastpath-e2e/' | wc -l)"
}

# write_kubelet_config: as make e2e's, registered with the API server
# (start_kubelet's --kubeconfig) instead of running static pods.
write_kubelet_config() {
	mkdir -p "$RUN/kubelet" "$RUN/pod-logs"
	{
		kubelet_config "$RUN/pod-logs" "$RUN/volume-plugins"
		cat <<EOF
# Device health reaches the Node's allocatable at this period (default 10s).
nodeStatusUpdateFrequency: 1s
EOF
	} >"$RUN/kubelet/config.yaml"
}

# start_kubelet [LABEL]: the kubelet registers the Node with the API server.
start_kubelet() {
	local label=${1:-}
	mkdir -p "$K"
	shared_root "$K"
	start kubelet "$WORK/bin/kubelet" --config "$RUN/kubelet/config.yaml" --kubeconfig "$KCFG/kubelet.kubeconfig" \
		--root-dir "$K" --cert-dir "$RUN/kubelet/pki" --hostname-override "$NODE" --v=2
	require "kubelet /healthz$label" 90 curl -sf "http://127.0.0.1:$HEALTHZ_PORT/healthz"
	require "node $NODE Ready$label" 120 kubectl wait --for condition=Ready --timeout 1s "node/$NODE"
}
