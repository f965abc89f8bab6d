//go:build nodra

package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strings"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
)

// This is the lean device-plugin-only build (-tags nodra): no Kubernetes
// API client, no DRA. A config that serves a pool through DRA is an error
// that says which binary serves it.

// draBuild says, in --version, whether this build serves DRA.
const draBuild = "without DRA"

// draNeeded is what to run instead.
const draNeeded = "this build has no DRA: run rdma-device-plugin-dra (deployments/components/dra)"

type draFlags struct{}

func registerDRAFlags(*flag.FlagSet, *draFlags) {}

func (f draFlags) withNode(string) draFlags { return f }

type draHook struct{}

func (*draHook) stop() error { return nil }

func startDRA(ctx context.Context, _ draFlags, _, _, _ string, first plugin.Scan, scan plugin.ScanFunc, log *slog.Logger) (context.Context, plugin.ScanFunc, *draHook, error) {
	if names := draPoolNames(first.Pools); len(names) > 0 {
		return nil, nil, nil, fmt.Errorf("pool %s is served by DRA (\"servedBy\": \"dra\"), but %s", strings.Join(names, ", "), draNeeded)
	}
	return ctx, watchConfig(scan, log, draNeeded), &draHook{}, nil
}

// draPrepared is nil: this build prepares no DRA claims.
func draPrepared(draFlags) func() (map[string]string, error) { return nil }

// draPreparedUnder is nil: this build prepares no DRA claims (the DRA
// build, rdma-device-plugin-dra, reads the node's checkpoint).
func draPreparedUnder(string) func() (map[string]string, error) { return nil }
