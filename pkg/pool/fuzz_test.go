package pool_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// FuzzParse feeds the parser mutated configs: it must never panic, and a
// config it accepts must hold what Build and the plugin rely on.
func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join("..", "..", "testdata", "config", "*.json"))
	for _, s := range seeds {
		data, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"resourceList":[{"resourceName":"a","selectors":[{"pfNames":["x#0-3,5"]},{"rootDevices":["0000:00:00.0#1"]}]}]}`))
	f.Add([]byte(`{"configList":[{"resourceName":"a","rdmaHcaMax":"7","devices":["ib0"]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := pool.Parse(data)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, r := range cfg.Resources {
			if seen[r.ResourceName()] {
				t.Fatalf("duplicate resource %s accepted", r.ResourceName())
			}
			seen[r.ResourceName()] = true
			if r.Prefix == "" || r.Name == "" || len(r.Selectors) == 0 {
				t.Fatalf("incomplete resource accepted: %+v", r)
			}
			if r.Kind == pool.Shared && (r.RdmaHcaMax < 1 || r.RdmaHcaMax > pool.MaxRdmaHcaMax) {
				t.Fatalf("rdmaHcaMax %d accepted", r.RdmaHcaMax)
			}
			for _, s := range r.Selectors {
				for _, set := range append(s.PFNames, s.RootDevices...) {
					for _, rg := range set.Ranges {
						if rg[0] > rg[1] || rg[0] < 0 {
							t.Fatalf("bad range %v accepted", rg)
						}
					}
				}
			}
		}
		pools, _ := pool.Build(cfg, nil)
		if len(pools) != len(cfg.Resources) {
			t.Fatalf("Build made %d pools for %d resources", len(pools), len(cfg.Resources))
		}
	})
}
