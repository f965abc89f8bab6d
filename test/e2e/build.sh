#!/usr/bin/env bash
# Builds everything the e2e test runs, from the Go module proxy only:
# the upstream kubelet, containerd with its runc shim, the CNI reference
# plugins, a pause image (no registry) and this repo's binaries.
#
# Upstream builds are cached in $WORK and skipped when the stamp next to
# them names the pinned version, so only the first run pays for them
# (about 9 minutes on 2 cores with empty Go caches). runc comes from apt.
#
# Usage: test/e2e/build.sh        (WORK, K8S_VERSION, CONTAINERD_VERSION,
#                                  CNI_PLUGINS_VERSION override the defaults)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Static binaries, like upstream's release builds. GOFLAGS from the caller
# (CI sets -mod=readonly for this repo) must not leak into the scratch
# module or into `go install pkg@version`.
export CGO_ENABLED=0 GOFLAGS=

# fresh NAME VERSION succeeds when NAME was built at VERSION before.
fresh() { [[ -f $WORK/stamps/$1 && $(<"$WORK/stamps/$1") == "$2" ]]; }
stamp() { mkdir -p "$WORK/stamps" && echo "$2" >"$WORK/stamps/$1"; }

# k8s_module prepares $WORK/k8s-build, a scratch module that builds
# components of k8s.io/kubernetes at $K8S_VERSION. k8s.io/kubernetes
# requires its staging modules (k8s.io/api, client-go, …) at v0.0.0 and
# replaces them with ./staging/… directories, which a module that requires
# k8s.io/kubernetes does not see; so the scratch module replaces every
# staging module that kubernetes requires with its published v0.X.Y tag.
# Modules only listed in kubernetes' replace block (sample-controller, …)
# are not published, so they are left out. One module for every component
# (kubelet, API server, …): they share one go.sum and one build cache.
k8s_module() {
	local staging_version=v0.${K8S_VERSION#v1.} mod=$WORK/k8s-build
	if fresh k8s-module "$K8S_VERSION" && [[ -f $mod/go.sum ]]; then
		return
	fi
	rm -rf "$mod" && mkdir -p "$mod"
	(
		cd "$mod"
		# A go.mod first, so that `go mod download` below runs in this module
		# and not in the repo's, whose go.mod is two levels up.
		echo "module k8sbuild" >go.mod
		local kgomod
		kgomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
		[[ -f $kgomod ]] || die "k8s.io/kubernetes@$K8S_VERSION: no go.mod from the module proxy"
		{
			echo "module k8sbuild"
			echo
			echo "go $(awk '$1 == "go" { print $2; exit }' "$kgomod")"
			echo
			echo "require k8s.io/kubernetes $K8S_VERSION"
			echo
			echo "replace ("
			local m
			sed -n '/^replace (/,/^)/p' "$kgomod" | awk '$3 ~ /^\.\/staging\// { print $1 }' | while read -r m; do
				if grep -qE "^[[:space:]]+$m v0\.0\.0" "$kgomod"; then
					printf '\t%s => %s %s\n' "$m" "$m" "$staging_version"
				fi
			done
			echo ")"
		} >go.mod
		{
			echo "//go:build tools"
			echo
			echo "package k8sbuild"
			echo
			echo "import ("
			local c
			for c in $K8S_COMPONENTS; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
			echo ")"
		} >tools.go
		go mod tidy
	)
	stamp k8s-module "$K8S_VERSION"
}

# build_k8s STAMP COMPONENT... builds k8s.io/kubernetes/cmd/COMPONENT into
# $WORK/bin, static, in one go build (packages they share compile once).
# Skipped when $WORK/stamps/STAMP names $K8S_VERSION and the binaries exist.
build_k8s() {
	local name=$1 c t0 have=1
	shift
	for c in "$@"; do [[ -x $WORK/bin/$c ]] || have=; done
	if fresh "$name" "$K8S_VERSION" && [[ -n $have ]]; then
		log "$* $K8S_VERSION: cached"
		return
	fi
	t0=$(date +%s.%N)
	log "$* $K8S_VERSION: building (staging modules at v0.${K8S_VERSION#v1.})"
	k8s_module
	mkdir -p "$WORK/bin"
	local pkgs=()
	for c in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
	(cd "$WORK/k8s-build" && go build -trimpath \
		-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" \
		-o "$WORK/bin/" "${pkgs[@]}")
	stamp "$name" "$K8S_VERSION"
	log "$* $K8S_VERSION: built in $(elapsed "$t0")s"
}

build_kubelet() {
	build_k8s kubelet kubelet
	log "$("$WORK/bin/kubelet" --version)"
}

# build_containerd installs containerd, ctr and the runc v2 shim. Their
# go.mod has no replace directives, so `go install pkg@version` works.
# no_btrfs: the btrfs snapshotter needs cgo and is not used.
build_containerd() {
	if fresh containerd "$CONTAINERD_VERSION" && [[ -x $WORK/bin/containerd ]]; then
		log "containerd $CONTAINERD_VERSION: cached"
		return
	fi
	local t0 p=github.com/containerd/containerd/v2
	t0=$(date +%s.%N)
	log "containerd $CONTAINERD_VERSION: building"
	GOBIN=$WORK/bin go install -trimpath -tags no_btrfs \
		-ldflags "-s -w -X $p/version.Version=$CONTAINERD_VERSION" \
		"$p/cmd/containerd@$CONTAINERD_VERSION" \
		"$p/cmd/ctr@$CONTAINERD_VERSION" \
		"$p/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
	stamp containerd "$CONTAINERD_VERSION"
	log "containerd $CONTAINERD_VERSION: built in $(elapsed "$t0")s"
}

# build_cni_plugins installs the reference plugins the test uses:
# loopback (containerd sets up lo with it), host-local and static (IPAM),
# bridge (the pod network with E2E_CNI=bridge, or without cmd/sriov-cni).
build_cni_plugins() {
	if fresh cni-plugins "$CNI_PLUGINS_VERSION" && [[ -x $WORK/cni-plugins/host-local ]]; then
		log "CNI plugins $CNI_PLUGINS_VERSION: cached"
		return
	fi
	local t0 p=github.com/containernetworking/plugins/plugins
	t0=$(date +%s.%N)
	log "CNI plugins $CNI_PLUGINS_VERSION: building"
	GOBIN=$WORK/cni-plugins go install -trimpath -ldflags "-s -w" \
		"$p/main/loopback@$CNI_PLUGINS_VERSION" \
		"$p/main/bridge@$CNI_PLUGINS_VERSION" \
		"$p/ipam/host-local@$CNI_PLUGINS_VERSION" \
		"$p/ipam/static@$CNI_PLUGINS_VERSION"
	stamp cni-plugins "$CNI_PLUGINS_VERSION"
	log "CNI plugins $CNI_PLUGINS_VERSION: built in $(elapsed "$t0")s"
}

# build_pause_image packs test/e2e/cmd/pause into an OCI image layout tar by
# hand (one uncompressed layer), for `ctr images import`. There is no
# registry here: the kubelet pod uses imagePullPolicy Never and containerd
# pins it as its sandbox image. Rebuilt every run: it takes a second.
build_pause_image() {
	local d=$WORK/image
	rm -rf "$d" && mkdir -p "$d/rootfs" "$d/oci/blobs/sha256"
	(cd "$REPO" && go build -trimpath -ldflags "-s -w" -o "$d/rootfs/pause" ./test/e2e/cmd/pause)
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$d/rootfs" -cf "$d/layer.tar" pause

	local layer config manifest
	layer=$(blob "$d" "$d/layer.tar")
	printf '%s' '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:'"$layer"'"]}}' >"$d/config.json"
	config=$(blob "$d" "$d/config.json")
	printf '%s' '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:'"$config"'","size":'"$(stat -c %s "$d/config.json")"'},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:'"$layer"'","size":'"$(stat -c %s "$d/layer.tar")"'}]}' >"$d/manifest.json"
	manifest=$(blob "$d" "$d/manifest.json")
	printf '%s' '{"imageLayoutVersion":"1.0.0"}' >"$d/oci/oci-layout"
	printf '%s' '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:'"$manifest"'","size":'"$(stat -c %s "$d/manifest.json")"',"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"'"$PAUSE_IMAGE"'","org.opencontainers.image.ref.name":"'"${PAUSE_IMAGE##*:}"'"}}]}' >"$d/oci/index.json"
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$d/oci" -cf "$d/pause-oci.tar" .
	log "pause image $PAUSE_IMAGE: $d/pause-oci.tar (manifest sha256:$manifest)"
}

# blob DIR FILE stores FILE as a content-addressed blob and prints its digest.
blob() {
	local sum
	sum=$(sha256sum "$2" | cut -d' ' -f1)
	cp "$2" "$1/oci/blobs/sha256/$sum"
	echo "$sum"
}

# build_repo builds this repo's binaries; the Go build cache makes it quick.
# The CNI plugin is built only once it exists (the lead is writing it).
build_repo() {
	mkdir -p "$WORK/bin"
	cd "$REPO"
	go build -o "$WORK/bin/" ./cmd/rdma-device-plugin ./test/e2e/cmd/podres ./test/e2e/cmd/kernel-standin
	rm -f "$WORK/bin/sriov"
	if [[ -d $REPO/cmd/sriov-cni ]]; then
		go build -o "$WORK/bin/sriov" ./cmd/sriov-cni
	fi
	log "repo binaries built: rdma-device-plugin podres kernel-standin$([[ -x $WORK/bin/sriov ]] && echo " sriov")"
}

main() {
	local t0
	t0=$(date +%s.%N)
	mkdir -p "$WORK"
	build_kubelet
	build_containerd
	build_cni_plugins
	build_pause_image
	build_repo
	log "build done in $(elapsed "$t0")s"
}

# Sourced by test/e2e-cluster/build.sh for its functions; run, it builds.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
	main "$@"
fi
