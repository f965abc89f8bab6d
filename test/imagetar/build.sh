#!/usr/bin/env bash
# make image-tar: the fastpath image, laid out as the Dockerfile lays it out,
# built without a Docker engine or a registry into an image tarball that
# `docker load`, `podman load` and `ctr -n k8s.io images import` read.
#
#   /usr/bin/rdma-device-plugin, /usr/bin/sriov  static, version embedded
#   /usr/bin/rdma-device-plugin-dra              the build with DRA
#   /usr/share/misc/pci.ids                      Debian's pci.ids package
#   /bin/busybox and /bin/{sh,cp,mv,chmod,sleep} Debian's busybox-static: the
#                                                init container's shell; sleep
#                                                for deployments/uninstall
#   USER 65532:65532, ENTRYPOINT the device plugin
#
# Env: OUT (default bin/fastpath-image.tar), IMAGE (default
# ghcr.io/fastpath-k8s/fastpath:$VERSION), GOARCH (default the host's),
# VERSION and REVISION (default from git), DEB_CACHE (default .cache/debs).
# Off Debian, or for another GOARCH than the host's, give BUSYBOX=a static
# busybox for that architecture and PCI_IDS=a pci.ids file.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
export PATH=/usr/local/go/bin:$PATH

log() { printf '%s image-tar: %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

GOARCH=${GOARCH:-$(go env GOARCH)}
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo devel)}
REVISION=${REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
IMAGE=${IMAGE:-ghcr.io/fastpath-k8s/fastpath:$VERSION}
OUT=${OUT:-bin/fastpath-image.tar}
DEB_CACHE=${DEB_CACHE:-$REPO/.cache/debs}

# deb_file PACKAGE PATH prints where PATH of Debian's PACKAGE is, fetching
# the .deb with `apt-get download` into DEB_CACHE once (no root needed, but
# apt's package lists must be there: as root this runs apt-get update when
# they are not).
deb_file() {
	local pkg=$1 file=$2 arch deb
	arch=$(dpkg --print-architecture 2>/dev/null) || die "no dpkg: give BUSYBOX= and PCI_IDS= (see the head of $0)"
	[[ $pkg == pci.ids ]] || [[ $GOARCH == "$arch" ]] ||
		die "$pkg for $GOARCH on a $arch host: give a static busybox for $GOARCH as BUSYBOX="
	mkdir -p "$DEB_CACHE"
	deb=$(find "$DEB_CACHE" -maxdepth 1 -name "${pkg}_*.deb" | sort | tail -n1)
	if [[ -z $deb ]]; then
		if ! (cd "$DEB_CACHE" && apt-get download -qq "$pkg" 2>/dev/null); then
			((EUID == 0)) || die "apt-get download $pkg failed; run apt-get update (as root) first"
			log "apt-get download $pkg failed; updating the package lists"
			apt-get update -qq
			(cd "$DEB_CACHE" && apt-get download -qq "$pkg") || die "apt-get download $pkg failed"
		fi
		deb=$(find "$DEB_CACHE" -maxdepth 1 -name "${pkg}_*.deb" | sort | tail -n1)
		rm -rf "$DEB_CACHE/$pkg"
	fi
	if [[ ! -e $DEB_CACHE/$pkg/$file ]]; then
		rm -rf "$DEB_CACHE/$pkg"
		dpkg-deb -x "$deb" "$DEB_CACHE/$pkg"
	fi
	[[ -f $DEB_CACHE/$pkg/$file ]] || die "$(basename "$deb") has no $file"
	echo "$DEB_CACHE/$pkg/$file"
}

BUSYBOX=${BUSYBOX:-$(deb_file busybox-static bin/busybox)}
PCI_IDS=${PCI_IDS:-$(deb_file pci.ids usr/share/misc/pci.ids)}
[[ -f $BUSYBOX && -f $PCI_IDS ]] || die "BUSYBOX=$BUSYBOX or PCI_IDS=$PCI_IDS is not a file"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
# As the Makefile builds them: internal/version stamped, gRPC without x/net/trace.
vpkg=github.com/fastpath-k8s/fastpath/internal/version
ldflags="-s -w -X $vpkg.Version=$VERSION -X $vpkg.Revision=$REVISION"
CGO_ENABLED=0 GOOS=linux GOARCH=$GOARCH GOFLAGS=${GOFLAGS:-} \
	go build -trimpath -tags grpcnotrace,nodra -ldflags "$ldflags" -o "$stage/rdma-device-plugin" ./cmd/rdma-device-plugin
# The build with DRA (deployments/components/dra runs it).
CGO_ENABLED=0 GOOS=linux GOARCH=$GOARCH GOFLAGS=${GOFLAGS:-} \
	go build -trimpath -tags grpcnotrace -ldflags "$ldflags" -o "$stage/rdma-device-plugin-dra" ./cmd/rdma-device-plugin
CGO_ENABLED=0 GOOS=linux GOARCH=$GOARCH GOFLAGS=${GOFLAGS:-} \
	go build -trimpath -tags grpcnotrace -ldflags "$ldflags" -o "$stage/sriov" ./cmd/sriov-cni
# The tool itself runs here, whatever GOARCH the image is for.
GOARCH= go build -o "$stage/imagetar" ./test/imagetar

mkdir -p "$(dirname "$OUT")"
"$stage/imagetar" -o "$OUT" -t "$IMAGE" -arch "$GOARCH" \
	-user 65532:65532 -entrypoint /usr/bin/rdma-device-plugin \
	-env PATH=/usr/bin:/bin \
	-label org.opencontainers.image.title=fastpath \
	-label "org.opencontainers.image.description=RDMA device plugin and SR-IOV CNI for ConnectX NICs" \
	-label org.opencontainers.image.source=https://github.com/fastpath-k8s/fastpath \
	-label "org.opencontainers.image.version=$VERSION" \
	-label "org.opencontainers.image.revision=$REVISION" \
	"/usr/bin/rdma-device-plugin=$stage/rdma-device-plugin" \
	"/usr/bin/rdma-device-plugin-dra=$stage/rdma-device-plugin-dra" \
	"/usr/bin/sriov=$stage/sriov" \
	"/usr/share/misc/pci.ids=$PCI_IDS" \
	"/bin/busybox=$BUSYBOX" \
	/bin/sh-\>busybox /bin/cp-\>busybox /bin/mv-\>busybox /bin/chmod-\>busybox /bin/sleep-\>busybox
log "$IMAGE ($GOARCH) in $OUT"
