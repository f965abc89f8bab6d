# fastpath — build, test and demo targets. Every target works from a clean
# clone with only Go installed; root-only parts say so instead of failing.

SHELL   := bash
GO      ?= go
BIN     := bin
HOSTROOT ?= testdata/sysfs/dgx-h100
CONFIG  ?= testdata/config/combined.json
PKGS    := ./...
# The build's identity, printed by --version, logged at startup and exported
# as fastpath_build_info. The Dockerfile passes the same -X flags.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
VERSION_PKG := github.com/fastpath-k8s/fastpath/internal/version
LDFLAGS  := -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Revision=$(REVISION)
# gRPC without golang.org/x/net/trace: its html/template keeps every
# exported method alive, 2.8 MB of binary and 1.4 MB of resident memory
# at start for a tracing page nothing serves.
BUILDTAGS := grpcnotrace

.PHONY: all build cross portable test test-short quick lint fmt vet bench discover demo rdma-check e2e e2e-cluster e2e-cluster-scale e2e-kernel e2e-kernel-matrix e2e-kernel-boots e2e-vm-cluster bench-cni-kernel image-tar fixtures clean soak fuzz vulncheck

all: lint build test

# Two builds of the device plugin: bin/rdma-device-plugin is the lean one
# (-tags nodra: device plugin API only, no Kubernetes API client, what the
# default DaemonSet runs); bin/rdma-device-plugin-dra also serves pools
# through DRA (deployments/components/dra runs it).
build:
	$(GO) build -tags '$(BUILDTAGS),nodra' -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...
	$(GO) build -tags '$(BUILDTAGS)' -ldflags '$(LDFLAGS)' -o $(BIN)/rdma-device-plugin-dra ./cmd/rdma-device-plugin

# Both binaries for arm64 (GH200/GB200 nodes) build too: a cross-compile
# check, nothing is kept.
cross:
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -o /dev/null ./cmd/rdma-device-plugin
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -tags nodra -o /dev/null ./cmd/rdma-device-plugin
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -o /dev/null ./cmd/sriov-cni

# The full suite, as CI runs it. Root-only tests (network namespaces, veth,
# bind mounts over /sys) skip with a reason when not run as root.
test: lint cross portable
	$(GO) test -count=1 -race -timeout 20m $(PKGS)

# The portable packages vet for macOS (people edit pool configs on
# laptops: _linux.go files hold what only Linux has), and discovery passes
# its tests through internal/sysfs's portable reader too.
portable:
	GOOS=darwin $(GO) vet ./pkg/...
	$(GO) test -count=1 -short -timeout 5m -tags fastpath_portable ./internal/sysfs ./pkg/pci ./pkg/rdma ./pkg/sriov ./pkg/nic ./pkg/pool

test-short:
	$(GO) test -count=1 -short -timeout 20m $(PKGS)

# The quick test: every test of the plugins and the libraries
# (cmd/, pkg/, internal/) with -short, which skips the tests that need a
# DRA build (the Kubernetes API client); no -race, no lint, no test/
# harnesses. A few minutes on 2 cores; see README.md's Set-up.
quick:
	$(GO) test -count=1 -short -timeout 5m ./cmd/... ./pkg/... ./internal/...

lint: fmt vet

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.e2e-work/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags nodra ./cmd/rdma-device-plugin/...

# Every benchmark in one table (benchmarks that need root skip without it).
# One package at a time: latency percentiles on 2 cores are not to be shared.
BENCH ?= .
bench:
	set -o pipefail; $(GO) test -p 1 -run '^$$' -bench '$(BENCH)' -benchmem -count=1 -timeout 60m $(PKGS) | $(GO) run ./test/benchtable

# What the bundled DGX fixture host has, and which pool gets what.
discover:
	$(GO) run ./cmd/rdma-device-plugin discover --host-root $(HOSTROOT) --config $(CONFIG)

# End-to-end on the upstream kubelet (standalone, static pods), containerd
# and runc, with our device plugin and CNI on the DGX fixture host. Needs
# root (says so otherwise). The first run builds the kubelet, containerd and
# the CNI reference plugins into .e2e-work; later runs reuse them.
e2e:
	test/e2e/run.sh

# The user's path on a one-node cluster built here (root): etcd, the API
# server, scheduler and controller-manager, the kubelet and containerd,
# Multus and whereabouts; deployments/ applied through kubectl apply -k with
# the image from make image-tar; the seed's and the example training pods.
# Shares .e2e-work with make e2e. See test/e2e-cluster/README.md.
e2e-cluster:
	test/e2e-cluster/run.sh

# The scale phase alone (root): eight DGX-like nodes, the seed's job of 64
# pods with and without VFs timed, 20 churn cycles (E2E_SCALE_CYCLES; make
# e2e-cluster runs 2), faults during a burst. See test/e2e-cluster/README.md.
e2e-cluster-scale:
	E2E_CLUSTER_PHASES=scale E2E_SCALE_CYCLES=$${E2E_SCALE_CYCLES:-20} test/e2e-cluster/run.sh

# fastpath inside a real Linux kernel (root): QEMU (>= 8.0, from
# bookworm-backports) boots one of Debian's kernels (KERNEL=5.10, 6.1, 6.12
# or 7.3; 6.12 by default) with emulated SR-IOV NICs
# (igb, 7 VFs per PF) and an IOMMU; provisioning, discovery and serve, the
# CNI (SIGKILLs included) and rdma_rxe run on it, one PASS/FAIL line per
# check, a SKIP line where the kernel lacks what a check needs. Skips,
# saying why, where QEMU or the kernel cannot be had. Caches
# in .e2e-work/kernel (WORK=DIR: DIR/kernel). See test/e2e-kernel/README.md.
e2e-kernel:
	KERNEL=$(KERNEL) test/e2e-kernel/run.sh

# make e2e-kernel on every guest kernel (5.10, 6.1, 6.12, 7.3), then one
# table: kernel, passed, failed, skipped, time.
e2e-kernel-matrix:
	test/e2e-kernel/matrix.sh

# The guest booted BOOTS times in a row (5) beside LOAD busy loops (4),
# setup and capture only: boots that ran to their end, panics.
e2e-kernel-boots:
	KERNEL=$(KERNEL) test/e2e-kernel/boots.sh

# The seed's flow on two real nodes (root): two QEMU guests (TCG, Debian's
# kernel, igb PFs on one wire between them), each a Kubernetes node of
# its own (kubelet, containerd, runc, Multus, whereabouts in an initramfs)
# joined to make e2e-cluster's control plane on the host; the shipped
# DaemonSet with components/provision, the seed's NAD and one training pod
# per node, traffic across the wire over real VFs; on KERNEL=7.3 (rxe
# netns-aware) RDMA bytes between the two pods too. KERNEL as make
# e2e-kernel's (6.12 when unset). Not beside make e2e-cluster (the same
# ports). See test/e2e-vm-cluster/README.md.
e2e-vm-cluster:
	KERNEL=$(KERNEL) test/e2e-vm-cluster/run.sh

# Builds of the sriov CNI side by side in that guest: ADD, DEL and VERSION
# p50 / p90 (BASE=REV adds a git revision's build, UPSTREAM=FILE another
# binary). Not part of make test or CI.
bench-cni-kernel:
	test/e2e-kernel/bench-cni.sh

# The fastpath image without a Docker engine: bin/fastpath-image.tar, for
# docker load, podman load or ctr -n k8s.io images import. IMAGE= names it.
image-tar:
	VERSION=$(VERSION) REVISION=$(REVISION) test/imagetar/build.sh

# The whole flow on the bundled DGX fixture host, as root: device plugin,
# allocation, the sriov CNI into a fresh netns (veth stand-ins for the VFs),
# what the pod got, then DEL and a check that nothing is left behind. The
# demo runs in a network namespace of its own (no route to the module
# proxy), so what its build step needs is downloaded first.
demo:
	@if [ "$$(id -u)" != 0 ]; then echo "make demo needs root: it creates a network namespace and veth links standing in for the VFs (sudo make demo)"; exit 2; fi
	$(GO) list -deps ./cmd/... github.com/containernetworking/plugins/plugins/ipam/host-local >/dev/null
	$(GO) run ./test/demo --host-root $(HOSTROOT) --config $(CONFIG)

# The RDMA path on the running kernel, as root: soft-RoCE (rdma_rxe) on veth
# stand-ins for VFs, the sriov CNI's ADD/CHECK/DEL in both RDMA netns modes
# (the mode is switched where the kernel lets it, and put back), doctor
# against the real RDMA netlink; with a GPU, PyTorch and NCCL, an NCCL
# all-reduce between two pods over sockets and over rxe. Where the kernel
# has no rdma_rxe it says why and passes. See docs/rdma-check.md.
rdma-check:
	@if [ "$$(id -u)" != 0 ]; then echo "make rdma-check needs root: it loads rdma_rxe, makes veth links, rxe devices and network namespaces, and may switch the RDMA netns mode (sudo make rdma-check)"; exit 2; fi
	$(GO) run ./test/rdmacheck

# Every Fuzz... target in the repo, FUZZTIME each (test/fuzz/run.sh says
# how a failure is told from go1.26's fuzztime-deadline race).
FUZZTIME ?= 5s
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) BIN=$(BIN) test/fuzz/run.sh

# Known vulnerabilities in what the binaries link (docs/security.md):
# govulncheck, from the module proxy, over every package. Its database is
# VULNDB (a URL such as https://vuln.go.dev, or file:///DIR) when set;
# otherwise it is built here from the golang.org/x/vulndb module, which the
# module proxy serves too (its data/osv and cmd/indexdb), so the scan needs
# no access but the module proxy's. VULNDB_VERSION=latest takes the newest
# reports.
GOVULNCHECK_VERSION ?= v1.10.0
VULNDB_VERSION ?= latest
VULNDB ?=
vulncheck:
	@set -euo pipefail; mkdir -p $(BIN); \
	GOFLAGS= GOBIN=$(abspath $(BIN)) $(GO) install golang.org/x/vuln/cmd/govulncheck@$(GOVULNCHECK_VERSION); \
	db='$(VULNDB)'; \
	if [ -z "$$db" ]; then \
		mod=$$(GOFLAGS= $(GO) mod download -json golang.org/x/vulndb@$(VULNDB_VERSION)); \
		dir=$$(jq -r .Dir <<<"$$mod"); ver=$$(jq -r .Version <<<"$$mod"); \
		[ -d "$$dir/data/osv" ] || { echo "vulncheck: golang.org/x/vulndb@$$ver has no data/osv"; exit 1; }; \
		rm -rf $(BIN)/vulndb; \
		GOFLAGS= $(GO) run golang.org/x/vulndb/cmd/indexdb@$$ver -vulns "$$dir/data/osv" -out $(abspath $(BIN))/vulndb; \
		db=file://$(abspath $(BIN))/vulndb; \
	fi; \
	echo "govulncheck $(GOVULNCHECK_VERSION), database $$db"; \
	$(BIN)/govulncheck -db "$$db" $(PKGS)

# Fault injection, as root: every TestSoak... test in the repo (kills at
# random moments and at every step boundary, races, garbage input, a leak
# check after every cycle) with its long budget (internal/testsupport/testnet.Soak;
# SOAK_DURATION overrides it), one package at a time. `make test` runs the
# same tests with a short budget. The figures are printed at the end.
SOAK_DURATION ?=
SOAK_REPORT   := $(BIN)/soak-report.txt
soak:
	@if [ "$$(id -u)" != 0 ]; then echo "make soak needs root: it kills the plugins mid-step on veth stand-ins in network namespaces (sudo make soak)"; exit 2; fi
	mkdir -p $(BIN) && rm -f $(SOAK_REPORT)
	FASTPATH_SOAK=long FASTPATH_SOAK_DURATION=$(SOAK_DURATION) FASTPATH_SOAK_REPORT=$(abspath $(SOAK_REPORT)) \
		$(GO) test -p 1 -count=1 -timeout 180m -run '^TestSoak' $(PKGS); \
	rc=$$?; echo "soak figures:"; cat $(SOAK_REPORT) 2>/dev/null; exit $$rc

# Regenerate the committed fixture hosts from internal/testsupport/fixture.
fixtures:
	rm -rf testdata/sysfs
	$(GO) run ./internal/testsupport/fixture/cmd/mkfixtures -o testdata/sysfs

clean:
	rm -rf $(BIN) .e2e-work
