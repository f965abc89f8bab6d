package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/latency"
)

// The CNI benchmark (test/e2e-kernel/bench-cni.sh): builds of a CNI
// plugin side by side on one igbvf VF, as the runtime execs them. It runs
// only when -checks names it (bench/...), never in make e2e-kernel.

// benchDir holds the builds under test, one file per build, named for the
// table (run.sh copies them from E2E_KERNEL_BENCH_BINS).
const benchDir = "/opt/cni/bench"

// benchConf is the conf of issue 40's comparison: mac, vlan, spoofchk,
// trust and static IPAM, and nothing the two plugins read differently.
// stateDir keeps fastpath's files apart from upstream's (which has no such
// key and keeps /var/lib/cni/sriov); upstream ignores it. fastpath's
// builds since the node config take it from there (benchRound writes
// one with the same stateDir) and accept the conf's, equal to it.
func benchConf(v *vf, build string) map[string]any {
	return map[string]any{
		"cniVersion": "1.0.0", "name": cniNet, "type": "sriov",
		"deviceID": v.addr, "stateDir": benchStateDir(build),
		"mac": "52:54:00:be:00:01", "vlan": 200, "spoofchk": "on", "trust": "on",
		"ipam": map[string]any{"type": "static", "addresses": []map[string]string{{"address": "10.98.0.1/24"}}},
	}
}

func benchStateDir(build string) string { return "/var/lib/cni/bench-" + build }

// benchTimes are one build's samples.
type benchTimes struct{ version, add, del, addDel latency.Samples }

func benchChecks() []check {
	return []check{
		{"bench/cni-add-del", func(g *guest) error {
			ents, err := os.ReadDir(benchDir)
			if err != nil || len(ents) == 0 {
				return fmt.Errorf("no builds in %s (E2E_KERNEL_BENCH_BINS): %v", benchDir, err)
			}
			var builds []string
			for _, e := range ents {
				builds = append(builds, e.Name())
			}
			rounds := 25
			if s := os.Getenv("E2E_KERNEL_BENCH_ROUNDS"); s != "" {
				if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 {
					return fmt.Errorf("E2E_KERNEL_BENCH_ROUNDS %q: want a positive number", s)
				}
			}
			v, err := g.cniVF(g.wireA, 0)
			if err != nil {
				return err
			}
			res := map[string]*benchTimes{}
			for _, b := range builds {
				res[b] = &benchTimes{}
				// one untimed round each: the first exec pays for reading
				// the binary from the initramfs into the page cache
				if err := benchRound(v, b, &benchTimes{}); err != nil {
					return err
				}
			}
			for r := 0; r < rounds; r++ {
				order := slices.Clone(builds)
				if r%2 == 1 {
					slices.Reverse(order)
				}
				for _, b := range order {
					if err := benchRound(v, b, res[b]); err != nil {
						return fmt.Errorf("round %d: %w", r+1, err)
					}
				}
			}
			logf("CNI builds on %s, %d alternating rounds, ms (p50 / p90):", v, rounds)
			logf("| build | size | VERSION | ADD | DEL | ADD+DEL |")
			logf("|---|---|---|---|---|---|")
			for _, b := range builds {
				t := res[b]
				st, _ := os.Stat(filepath.Join(benchDir, b))
				logf("| %s | %.1f MB | %s | %s | %s | %s |", b, float64(st.Size())/1e6,
					pcts(t.version), pcts(t.add), pcts(t.del), pcts(t.addDel))
			}
			return nil
		}},
	}
}

// benchRound execs build for VERSION, then ADD and DEL of v in a fresh
// pod netns, and checks that DEL put the VF back.
func benchRound(v *vf, build string, t *benchTimes) error {
	bin := filepath.Join(benchDir, build)
	t0 := time.Now()
	if r := run(time.Minute, []string{"CNI_COMMAND=VERSION"}, `{"cniVersion":"1.0.0"}`, bin); r.err != nil {
		return fmt.Errorf("%s VERSION: %s", build, r)
	}
	t.version = append(t.version, time.Since(t0))
	p, err := newPod("bench")
	if err != nil {
		return err
	}
	defer p.del()
	c := cniCall{"ADD", "bench", p.path, "net1", benchConf(v, build)}
	// A build that reads a node config takes its stateDir from there (the
	// conf's must then equal it); the env's last value wins over c.env's.
	node := filepath.Join(e2eDir, "bench-node-"+build+".json")
	if err := writeCNINodeConfig(node, benchStateDir(build)); err != nil {
		return err
	}
	env := func() []string { return append(c.env(), "FASTPATH_CNI_NODE_CONFIG="+node) }
	t0 = time.Now()
	r := run(2*time.Minute, env(), c.stdin(), bin)
	add := time.Since(t0)
	if r.err != nil {
		c.command = "DEL"
		_ = run(2*time.Minute, env(), c.stdin(), bin)
		return fmt.Errorf("%s ADD: %s", build, r)
	}
	c.command = "DEL"
	t0 = time.Now()
	r = run(2*time.Minute, env(), c.stdin(), bin)
	del := time.Since(t0)
	if r.err != nil {
		return fmt.Errorf("%s DEL: %s", build, r)
	}
	if why := v.home(); why != "" {
		return fmt.Errorf("%s: after DEL the VF is not back: %s", build, why)
	}
	t.add = append(t.add, add)
	t.del = append(t.del, del)
	t.addDel = append(t.addDel, add+del)
	return nil
}

// pcts is "p50 / p90" of samples in milliseconds (nearest rank).
func pcts(s latency.Samples) string {
	ms := func(p float64) float64 { return float64(s.Percentile(p).Microseconds()) / 1000 }
	return fmt.Sprintf("%.0f / %.0f", ms(50), ms(90))
}
