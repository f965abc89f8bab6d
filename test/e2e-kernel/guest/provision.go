package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/kubeletstub"
)

const (
	plugin        = "/usr/bin/rdma-device-plugin"
	e2eDir        = "/tmp/e2e"
	provisionDir  = e2eDir + "/provision"
	cniStateDir   = e2eDir + "/cni-state"
	podResSocket  = e2eDir + "/pod-resources.sock"
	provisionWait = "20s" // --provision-timeout: a VF that never binds fails in 20 s, not 60
)

// policyDoc is one SriovNetworkNodePolicy as YAML.
func policyDoc(name, resource string, numVfs int, deviceType, selector string) string {
	return fmt.Sprintf(`apiVersion: sriovnetwork.openshift.io/v1
kind: SriovNetworkNodePolicy
metadata:
  name: %s
  namespace: sriov-network-operator
spec:
  resourceName: %s
  numVfs: %d
  priority: 50
  deviceType: %s
  nicSelector:
    vendor: "8086"
%s`, name, resource, numVfs, deviceType, selector)
}

func writePolicy(name string, docs ...string) (string, error) {
	if err := os.MkdirAll(e2eDir, 0o755); err != nil {
		return "", err
	}
	p := filepath.Join(e2eDir, name+".yaml")
	return p, os.WriteFile(p, []byte(strings.Join(docs, "---\n")), 0o644)
}

// planJSON is what provision -o json prints (cmd/rdma-device-plugin's
// planJSON: the fields read here).
type planJSON struct {
	PFs []struct {
		PF      string   `json:"pf"`
		Netdev  string   `json:"netdev"`
		Policy  string   `json:"policy"`
		NumVFs  int      `json:"numVfs"`
		Want    int      `json:"want"`
		Steps   []string `json:"steps"`
		Refused string   `json:"refused"`
	} `json:"pfs"`
	Warnings []string `json:"warnings"`
}

// provision runs the product's provision subcommand on the guest's own
// node; args are added (--dry-run, -o json).
func provisionRun(policy string, args ...string) cmdResult {
	a := append([]string{"provision", "--policy", policy, "--provision-state-dir", provisionDir,
		"--cni-state-dir", cniStateDir, "--pod-resources-socket", podResSocket, "--provision-timeout", provisionWait}, args...)
	name, argv := asDaemonSet(provisionCaps, a...)
	r := run(3*time.Minute, nil, "", name, argv...)
	appendLog("provision.log", fmt.Sprintf("$ rdma-device-plugin %s\n%s\n%s\nerr: %v\n", strings.Join(a, " "), r.stdout, r.stderr, r.err))
	return r
}

func provisionPlan(policy string) (planJSON, error) {
	var p planJSON
	r := provisionRun(policy, "--dry-run", "-o", "json")
	if r.err != nil {
		return p, fmt.Errorf("provision --dry-run: %s", r)
	}
	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil {
		return p, fmt.Errorf("provision --dry-run -o json: %w: %q", err, r.stdout)
	}
	return p, nil
}

// appendLog keeps a command's output in the logs that go out with the capture.
func appendLog(name, s string) {
	f, err := os.OpenFile(filepath.Join("/tmp/e2e-logs", name), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.WriteString(s)
}

// wantVFs checks a PF's VFs: n of them, the drivers by index, each
// igbvf VF with its netdev and each vfio-pci VF with its /dev/vfio group.
func wantVFs(p *pf, drivers ...string) error {
	vfs := vfsOf(p.addr)
	if len(vfs) != len(drivers) {
		return fmt.Errorf("%s: %d VFs (sriov_numvfs %s), want %d", p, len(vfs), devAttr(p.addr, "sriov_numvfs"), len(drivers))
	}
	var bad []string
	for i, v := range vfs {
		d := driverOf(v)
		switch {
		case d != drivers[i]:
			bad = append(bad, fmt.Sprintf("VF %d %s bound to %q, want %s", i, v, d, drivers[i]))
		case d == "igbvf" && len(netdevsOf(v)) != 1:
			bad = append(bad, fmt.Sprintf("VF %d %s: no netdev", i, v))
		case d == "vfio-pci":
			if _, err := os.Stat("/dev/vfio/" + iommuGroup(v)); err != nil {
				bad = append(bad, fmt.Sprintf("VF %d %s: %v", i, v, err))
			}
		}
	}
	if bad != nil {
		return fmt.Errorf("%s: %s", p, strings.Join(bad, "; "))
	}
	return nil
}

// vfIdentity is what a second run must leave as it was: each VF's
// address, driver and netdev ifindex.
func vfIdentity(p *pf) string {
	var b strings.Builder
	for _, v := range vfsOf(p.addr) {
		fmt.Fprintf(&b, "%s=%s", v, driverOf(v))
		for _, n := range netdevsOf(v) {
			idx, _ := readAttr(filepath.Join("/sys/class/net", n, "ifindex"))
			fmt.Fprintf(&b, "/%s#%s", n, idx)
		}
		b.WriteByte(' ')
	}
	return b.String()
}

// The policies of the provisioning phase: wire A by rootDevices, wire B
// split by pfNames ranges into netdevice and vfio-pci VFs.
func (g *guest) mainPolicies(numA int) []string {
	return []string{
		policyDoc("igb-root", "igb_root", numA, "netdevice", fmt.Sprintf("    rootDevices: [%q]\n", g.wireA.addr)),
		policyDoc("igb-names", "igb_names", 4, "netdevice", fmt.Sprintf("    pfNames: [%q]\n", g.wireB.netdev+"#0-1")),
		policyDoc("igb-vfio", "igb_vfio", 4, "vfio-pci", fmt.Sprintf("    pfNames: [%q]\n", g.wireB.netdev+"#2-3")),
	}
}

func provisionChecks() []check {
	var podRes *kubeletstub.PodResources
	return []check{
		{"provision/default-route-pf-left-alone", func(g *guest) error {
			if err := g.needs("setup/pfs", "setup/node-default-route"); err != nil {
				return err
			}
			// a policy by vendor and device only selects all three PFs; the
			// node's own network (its default route) must not be touched
			pol, err := writePolicy("any", policyDoc("igb-any", "igb_any", 2, "netdevice", "    deviceID: \"10c9\"\n"))
			if err != nil {
				return err
			}
			plan, err := provisionPlan(pol)
			if err != nil {
				return err
			}
			seen := map[string]bool{}
			for _, p := range plan.PFs {
				seen[p.PF] = true
				if p.PF == g.nodePF.addr && len(p.Steps) > 0 {
					return fmt.Errorf("the plan changes the default-route PF %s: %v", g.nodePF, p.Steps)
				}
			}
			if !seen[g.wireA.addr] || !seen[g.wireB.addr] {
				return fmt.Errorf("the plan does not select the wire PFs %s and %s: %+v (warnings %v)", g.wireA, g.wireB, plan.PFs, plan.Warnings)
			}
			logf("plan: %+v; warnings %v", plan.PFs, plan.Warnings)
			return nil
		}},
		{"provision/apply", func(g *guest) error {
			if err := g.needs("setup/pfs"); err != nil {
				return err
			}
			for _, p := range []*pf{g.wireA, g.wireB} {
				if err := setNumVFs(p.addr, 0); err != nil {
					return err
				}
			}
			pol, err := writePolicy("main", g.mainPolicies(3)...)
			if err != nil {
				return err
			}
			t := time.Now()
			r := provisionRun(pol)
			logf("provision took %v", time.Since(t).Round(100*time.Millisecond))
			var errs []error
			if r.err != nil {
				errs = append(errs, fmt.Errorf("provision: %s", r))
			}
			errs = append(errs, wantVFs(g.wireA, "igbvf", "igbvf", "igbvf"))
			errs = append(errs, wantVFs(g.wireB, "igbvf", "igbvf", "vfio-pci", "vfio-pci"))
			return errors.Join(errs...)
		}},
		{"provision/second-run-changes-nothing", func(g *guest) error {
			if err := g.needs("provision/apply"); err != nil {
				return err
			}
			pol := filepath.Join(e2eDir, "main.yaml")
			plan, err := provisionPlan(pol)
			if err != nil {
				return err
			}
			for _, p := range plan.PFs {
				if len(p.Steps) > 0 {
					return fmt.Errorf("a second plan still has steps for %s: %v", p.PF, p.Steps)
				}
			}
			before := vfIdentity(g.wireA) + vfIdentity(g.wireB)
			if r := provisionRun(pol); r.err != nil {
				return fmt.Errorf("second provision: %s", r)
			}
			if after := vfIdentity(g.wireA) + vfIdentity(g.wireB); after != before {
				return fmt.Errorf("the second run changed the VFs: before %s, after %s", before, after)
			}
			return nil
		}},
		{"provision/shrink-refused-while-held", func(g *guest) error {
			if err := g.needs("provision/apply"); err != nil {
				return err
			}
			vf0 := vfsOf(g.wireA.addr)[0]
			podRes = kubeletstub.NewPodResources(podResSocket)
			if err := podRes.Start(); err != nil {
				return err
			}
			podRes.Set(kubeletstub.Pod("team", "trainer-0", "intel.com/igb_root", vf0))
			pol, err := writePolicy("shrink", g.mainPolicies(2)...)
			if err != nil {
				return err
			}
			plan, err := provisionPlan(pol)
			if err != nil {
				return err
			}
			var refused string
			for _, p := range plan.PFs {
				if p.PF == g.wireA.addr {
					refused = p.Refused
				}
			}
			if !strings.Contains(refused, "trainer-0") {
				return fmt.Errorf("the plan for %s does not refuse the shrink naming the pod: refused %q (%+v)", g.wireA, refused, plan.PFs)
			}
			r := provisionRun(pol)
			logf("provision with the VF held: %s", oneLine(r.String()))
			if err := wantVFs(g.wireA, "igbvf", "igbvf", "igbvf"); err != nil {
				return fmt.Errorf("the held PF changed: %w", err)
			}
			return nil
		}},
		{"provision/shrink-converges-after-release", func(g *guest) error {
			if err := g.needs("provision/shrink-refused-while-held"); err != nil {
				return err
			}
			podRes.Set()
			defer podRes.Stop()
			if r := provisionRun(filepath.Join(e2eDir, "shrink.yaml")); r.err != nil {
				return fmt.Errorf("provision after the pod is gone: %s", r)
			}
			return errors.Join(wantVFs(g.wireA, "igbvf", "igbvf"), wantVFs(g.wireB, "igbvf", "igbvf", "vfio-pci", "vfio-pci"))
		}},
		{"provision/default-route-pf-when-named", func(g *guest) error {
			if err := g.needs("setup/pfs", "setup/node-default-route"); err != nil {
				return err
			}
			pol, err := writePolicy("node", policyDoc("igb-node", "igb_node", 1, "netdevice", fmt.Sprintf("    pfNames: [%q]\n", g.nodePF.netdev)))
			if err != nil {
				return err
			}
			r := provisionRun(pol)
			err = errors.Join(wantVFs(g.nodePF, "igbvf"))
			if r.err != nil {
				err = errors.Join(fmt.Errorf("provision: %s", r), err)
			}
			if e := setNumVFs(g.nodePF.addr, 0); e != nil {
				err = errors.Join(err, e)
			}
			return err
		}},
	}
}
