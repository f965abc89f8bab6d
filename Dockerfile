# fastpath image: the kubelet device plugin and the `sriov` CNI plugin, as
# static binaries, with the PCI ID database for model names.
#
#   docker build -t REGISTRY/fastpath:TAG \
#     --build-arg VERSION=$(git describe --tags --always) --build-arg REVISION=$(git rev-parse HEAD) .
#
# Multi-arch (amd64 x86 nodes, arm64 GH200/GB200 nodes), one manifest list:
#
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/fastpath:TAG --push .
#
# The build stage runs on the builder's own platform ($BUILDPLATFORM) and
# cross-compiles for each $TARGETARCH (static Go, no QEMU needed); only the
# final stage is per-architecture. Without a Docker engine: make image-tar.
#
# /usr/bin/rdma-device-plugin  the device plugin (deployments/20-daemonset.yaml)
# /usr/bin/sriov               the CNI plugin, copied to the node's /opt/cni/bin
#                              by the DaemonSet's init container
#                              (rdma-device-plugin install-cni)
#
# Base images by full version tag, the Go one the toolchain go.mod names. A
# release also pins them by digest, resolved where a registry is reachable
# (docs/security.md, finding 6):
#   crane digest golang:1.26.11-trixie; crane digest debian:13.2-slim
# and FROM golang:1.26.11-trixie@sha256:DIGEST etc.

FROM --platform=$BUILDPLATFORM golang:1.26.11-trixie AS build
ARG TARGETOS=linux
ARG TARGETARCH
# Printed by --version and the startup log, exported as fastpath_build_info
# (internal/version; the Makefile stamps the same variables).
ARG VERSION=dev
ARG REVISION=unknown
# Model names in `rdma-device-plugin discover` come from pci.ids, never from
# the network. Debian's pci.ids package puts it at /usr/share/misc/pci.ids.
RUN apt-get update \
 && apt-get install -y --no-install-recommends pci.ids \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0
ENV VERSION_PKG=github.com/fastpath-k8s/fastpath/internal/version
ENV LDFLAGS="-s -w -X ${VERSION_PKG}.Version=${VERSION} -X ${VERSION_PKG}.Revision=${REVISION}"
# Two builds of the device plugin: the default DaemonSet's, without DRA
# (-tags nodra: no Kubernetes API client linked), and the one
# deployments/components/dra runs, /usr/bin/rdma-device-plugin-dra.
RUN GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -tags grpcnotrace,nodra -ldflags "$LDFLAGS" -o /out/rdma-device-plugin ./cmd/rdma-device-plugin \
 && GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -tags grpcnotrace -ldflags "$LDFLAGS" -o /out/rdma-device-plugin-dra ./cmd/rdma-device-plugin \
 && GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -tags grpcnotrace -ldflags "$LDFLAGS" -o /out/sriov ./cmd/sriov-cni

# Debian slim: kubectl debug and exec sessions get a shell and the usual
# tools. The init container runs no shell: it installs the CNI binary with
# rdma-device-plugin install-cni.
FROM debian:13.2-slim
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION"
LABEL org.opencontainers.image.title="fastpath" \
      org.opencontainers.image.description="RDMA device plugin and SR-IOV CNI for ConnectX NICs" \
      org.opencontainers.image.source="https://github.com/fastpath-k8s/fastpath"
# The plugin looks for pci.ids under its --host-root: with the default "/" it
# finds this copy; with --host-root=/host it uses the node's own.
COPY --from=build /usr/share/misc/pci.ids /usr/share/misc/pci.ids
COPY --from=build /out/rdma-device-plugin /usr/bin/rdma-device-plugin
COPY --from=build /out/rdma-device-plugin-dra /usr/bin/rdma-device-plugin-dra
COPY --from=build /out/sriov /usr/bin/sriov
# Non-root by default (`discover` only reads sysfs). The DaemonSet runs both
# containers as root, without capabilities: the device plugin creates its
# sockets in the kubelet's root-owned /var/lib/kubelet/device-plugins, writes
# device-info files under /var/run, and lists /dev/infiniband; the init
# container writes to the node's root-owned /opt/cni/bin.
USER 65532:65532
ENTRYPOINT ["/usr/bin/rdma-device-plugin"]
