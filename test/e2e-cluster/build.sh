#!/usr/bin/env bash
# Builds everything make e2e-cluster runs, from the Go module proxy only:
# what make e2e builds (kubelet, containerd, the CNI reference plugins, the
# pause image, our binaries; test/e2e/build.sh), plus the control plane
# (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl),
# Multus' thin plugin, whereabouts, their CRDs and the fastpath image.
#
# Upstream builds are cached in $WORK and skipped when the stamp next to
# them names the pinned version (test/e2e/build.sh's fresh/stamp).
#
# Usage: test/e2e-cluster/build.sh   (WORK and the versions in lib.sh override)
set -euo pipefail
# test/e2e's build functions (sourcing it builds nothing), then this
# test's versions and paths.
source "$(dirname "$0")/../e2e/build.sh"
source "$(dirname "$0")/lib.sh"

# build_etcd builds the etcd server. Its module replaces its sibling modules
# (api, client, pkg) by ../ paths, so `go install …@version` refuses it: a
# scratch module requires it and takes the siblings at its own version.
build_etcd() {
	if fresh etcd "$ETCD_VERSION" && [[ -x $WORK/bin/etcd ]]; then
		log "etcd $ETCD_VERSION: cached"
		return
	fi
	local t0 mod=$WORK/etcd-build
	t0=$(date +%s.%N)
	log "etcd $ETCD_VERSION: building"
	scratch_module "$mod" etcdbuild go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3
	(cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$WORK/bin/etcd" go.etcd.io/etcd/server/v3)
	stamp etcd "$ETCD_VERSION"
	log "etcd $ETCD_VERSION: built in $(elapsed "$t0")s"
}

# scratch_module DIR NAME MODULE VERSION PACKAGE [REPLACE...] writes a
# module in DIR that requires MODULE@VERSION, imports PACKAGE from tools.go
# (so that tidy keeps what it needs) and has the given replace lines, and
# tidies it.
scratch_module() {
	local dir=$1 name=$2 module=$3 version=$4 pkg=$5 r
	shift 5
	rm -rf "$dir" && mkdir -p "$dir"
	{
		echo "module $name"
		echo
		echo "go 1.26"
		echo
		echo "require $module $version"
		for r in "$@"; do echo "replace $r"; done
	} >"$dir/go.mod"
	printf '//go:build tools\n\npackage %s\n\nimport _ "%s"\n' "$name" "$pkg" >"$dir/tools.go"
	(cd "$dir" && go mod tidy)
}

# build_multus builds Multus' thin plugin (the CNI binary that reads the
# NetworkAttachmentDefinitions from the API server). The module proxy serves
# only its explicit tags, not its version list, which `go install …@version`
# reads (for deprecations): a scratch module requires the tag instead.
build_multus() {
	if fresh multus "$MULTUS_VERSION" && [[ -x $WORK/cni-plugins/multus ]]; then
		log "multus $MULTUS_VERSION: cached"
		return
	fi
	local t0 p=gopkg.in/k8snetworkplumbingwg/multus-cni.v4 mod=$WORK/multus-build
	t0=$(date +%s.%N)
	log "multus $MULTUS_VERSION: building"
	scratch_module "$mod" multusbuild "$p" "$MULTUS_VERSION" "$p/cmd/multus"
	(cd "$mod" && go build -trimpath -ldflags "-s -w -X $p/pkg/multus.version=$MULTUS_VERSION" \
		-o "$WORK/cni-plugins/multus" "$p/cmd/multus")
	stamp multus "$MULTUS_VERSION"
	log "multus $MULTUS_VERSION: built in $(elapsed "$t0")s"
}

# build_whereabouts builds the whereabouts IPAM plugin. Its go.mod pins
# gogo/protobuf with a replace, which `go install …@version` refuses: a
# scratch module repeats that replace.
build_whereabouts() {
	if fresh whereabouts "$WHEREABOUTS_VERSION" && [[ -x $WORK/cni-plugins/whereabouts ]]; then
		log "whereabouts $WHEREABOUTS_VERSION: cached"
		return
	fi
	local t0 mod=$WORK/whereabouts-build
	t0=$(date +%s.%N)
	log "whereabouts $WHEREABOUTS_VERSION: building"
	scratch_module "$mod" wherebuild github.com/k8snetworkplumbingwg/whereabouts "$WHEREABOUTS_VERSION" \
		github.com/k8snetworkplumbingwg/whereabouts/cmd \
		"github.com/gogo/protobuf => github.com/gogo/protobuf v1.3.2"
	(cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$WORK/cni-plugins/whereabouts" github.com/k8snetworkplumbingwg/whereabouts/cmd)
	stamp whereabouts "$WHEREABOUTS_VERSION"
	log "whereabouts $WHEREABOUTS_VERSION: built in $(elapsed "$t0")s"
}

# fetch_crds takes the CRDs from the modules that define them, as the
# module proxy serves them: the NetworkAttachmentDefinition CRD from the
# network-attachment-definition-client module, whereabouts' from its own.
fetch_crds() {
	local d=$WORK/crds nad wa
	rm -rf "$d" && mkdir -p "$d"
	nad=$(module_dir github.com/k8snetworkplumbingwg/network-attachment-definition-client "$NAD_CLIENT_VERSION")
	wa=$(module_dir github.com/k8snetworkplumbingwg/whereabouts "$WHEREABOUTS_VERSION")
	cp "$nad/artifacts/networks-crd.yaml" "$d/network-attachment-definitions.yaml"
	cp "$wa"/doc/crds/whereabouts.cni.cncf.io_*.yaml "$d/"
	chmod 0644 "$d"/*.yaml
	log "CRDs: $(cd "$d" && echo *.yaml)"
}

# module_dir MODULE VERSION downloads a module and prints its directory.
module_dir() {
	local dir
	dir=$(cd "$WORK" && go mod download -json "$1@$2" | jq -r .Dir)
	[[ -d $dir ]] || die "$1@$2: not served by the module proxy"
	echo "$dir"
}

# build_image packs the fastpath image (make image-tar) into $WORK/fastpath-image.
build_image() {
	OUT=$WORK/fastpath-image/fastpath.tar IMAGE=$FASTPATH_IMAGE DEB_CACHE=$WORK/debs "$REPO/test/imagetar/build.sh"
}

# build_workload_image packs the image the training pods run in: busybox
# (from the same Debian package as the fastpath image) with every applet
# linked into /bin, and /bin/bash starting busybox's sh, for the examples'
# `/bin/bash -c` scripts. The seed's and the examples' own images (CUDA,
# PyTorch) are not to be had here; nothing here runs NCCL.
build_workload_image() {
	local d=$WORK/workload-image bb=$WORK/debs/busybox-static/bin/busybox a entries=()
	[[ -x $bb ]] || die "no busybox at $bb (build_image fetches it)"
	rm -rf "$d" && mkdir -p "$d"
	printf '#!/bin/sh\n# busybox sh standing in for bash in the e2e workload image\nexec /bin/sh "$@"\n' >"$d/bash"
	chmod 0755 "$d/bash"
	entries+=("/bin/busybox=$bb" "/bin/bash=$d/bash")
	for a in $("$bb" --list); do
		[[ $a == busybox || $a == bash || $a == */* ]] || entries+=("/bin/$a->busybox")
	done
	(cd "$REPO" && go build -o "$d/imagetar" ./test/imagetar)
	"$d/imagetar" -o "$d/workload.tar" -t "$WORKLOAD_IMAGE" -arch "$(go env GOARCH)" \
		-env PATH=/usr/bin:/bin "${entries[@]}" >/dev/null
	log "workload image $WORKLOAD_IMAGE: $d/workload.tar (${#entries[@]} entries)"
}

# build_gpu_standin builds the stand-in GPU DRA driver of the DRA phase
# (test/e2e-cluster/cmd/gpu-standin), a host process like the kubelet.
build_gpu_standin() {
	(cd "$REPO" && go build -o "$WORK/bin/gpu-standin" ./test/e2e-cluster/cmd/gpu-standin)
	log "gpu-standin built"
}

cluster_main() {
	local t0
	t0=$(date +%s.%N)
	mkdir -p "$WORK"
	build_kubelet
	build_k8s control-plane kube-apiserver kube-controller-manager kube-scheduler kubectl
	build_etcd
	build_containerd
	build_cni_plugins
	build_multus
	build_whereabouts
	fetch_crds
	build_pause_image
	build_repo
	build_gpu_standin
	build_image
	build_workload_image
	log "build done in $(elapsed "$t0")s"
}

cluster_main "$@"
