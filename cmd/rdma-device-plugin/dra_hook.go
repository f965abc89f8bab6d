package main

import (
	"log/slog"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// The DRA hook of serve, in both builds: dra.go links the DRA driver
// (k8s.io/client-go and the kubeletplugin helper, the default),
// dra_nodra.go stands for it in the lean device-plugin-only build
// (-tags nodra).

// servedByDevicePlugin turns down the pools DRA serves: a pool is served
// by one API, never both (plugin.Options.Serves).
func servedByDevicePlugin(p *pool.Pool) bool { return p.ServedBy != pool.ServedByDRA }

// draPoolNames are the resource names of the pools served by DRA.
func draPoolNames(pools []pool.Pool) []string {
	var out []string
	for i := range pools {
		if pools[i].ServedBy == pool.ServedByDRA {
			out = append(out, pools[i].ResourceName())
		}
	}
	return out
}

// watchConfig wraps the scan of a daemon that runs no DRA driver: a reload
// that marks a pool for DRA cannot start one, and says so (once) with why.
func watchConfig(scan plugin.ScanFunc, log *slog.Logger, why string) plugin.ScanFunc {
	var warned bool
	return func(reload bool) (plugin.Scan, error) {
		s, err := scan(reload)
		if names := draPoolNames(s.Pools); err == nil && !warned && len(names) > 0 {
			warned = true
			log.Error("dra: the config now serves pools through DRA, but "+why+"; until then those pools are served by neither API", "resources", names)
		}
		return s, err
	}
}
