package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
)

// A state file is evidence, not instructions (issue 44): a forged state
// for a real igbvf VF, of this boot, naming another PF's VF and a host
// link (a veth) as its netdev, drives neither ADD's reclaim nor DEL: the
// other VF's settings on its PF and the host link stay as they were, and
// the VF comes home.

// hostLinkNow is what teardown could change on a host link.
func hostLinkNow(name string) (string, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return "", err
	}
	a := l.Attrs()
	return fmt.Sprintf("%s index %d mtu %d mac %s alias %q", a.Name, a.Index, a.MTU, a.HardwareAddr, a.Alias), nil
}

// plantForged writes a state for v as a forger would: this boot's ID, a
// pod netns that is gone, and the host link and other's PF and index in
// place of the VF's own.
func plantForged(v, other *vf, hostLink string) error {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return err
	}
	st := map[string]any{
		"version": 2, "phase": "added", "bootID": strings.TrimSpace(string(boot)), "network": cniNet,
		"containerID": "forger", "ifName": "net1", "netns": "/run/netns/no-such-pod",
		"pciAddress": v.addr, "pfAddress": other.pf.addr, "pfNetdev": other.pf.netdev, "vfIndex": other.idx,
		"hostName": hostLink, "hostMAC": "02:66:6f:72:67:64", "hostMTU": 1400, "hostAlias": "forged", "hostUp": true,
		"podMAC": "02:00:00:00:00:01", "linkMoved": true,
		"vfApplied": []string{"vlan", "trust", "spoofchk"},
		"vfOrig":    map[string]any{"mac": "00:00:00:00:00:00", "vlan": 42, "proto": 0x8100, "spoofchk": false, "trust": true},
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(cniStateDir, v.addr+".json"), b, 0o600)
}

func evidenceChecks() []check {
	return []check{
		{"cni/forged-state-acts-on-nothing", func(g *guest) error {
			v, err := g.cniVF(g.wireA, 1)
			if err != nil {
				return err
			}
			other, err := g.newVF(g.wireB, 1)
			if err != nil {
				return err
			}
			// A veth (the guest kernel has no bridge driver; veth is in
			// its initramfs) stands for any host link that is no VF's.
			const hostLink = "fpforged0"
			if err := modprobe("veth"); err != nil {
				return err
			}
			_ = ipCmd("link", "del", hostLink)
			if err := ipCmd("link", "add", hostLink, "type", "veth", "peer", "name", "fpforged1"); err != nil {
				return err
			}
			defer func() { _ = ipCmd("link", "del", hostLink) }()
			linkWas, err := hostLinkNow(hostLink)
			if err != nil {
				return err
			}
			p, err := newPod("pod-forged")
			if err != nil {
				return err
			}
			defer p.del()
			c := conf(v, "", nil)
			var errs []error
			for _, step := range []struct{ name, command, netns string }{
				{"ADD (reclaim)", "ADD", p.path},
				{"DEL", "DEL", p.path},
				{"DEL of a forged state", "DEL", p.path},
			} {
				if step.name != "DEL" {
					if err := plantForged(v, other, hostLink); err != nil {
						return err
					}
				}
				r := cniCall{step.command, "pod-forged", step.netns, "net1", c}.do()
				if r.err != nil {
					errs = append(errs, fmt.Errorf("%s: %s", step.name, r))
				}
				if linkNow, err := hostLinkNow(hostLink); err != nil || linkNow != linkWas {
					errs = append(errs, fmt.Errorf("after %s the host link is %s (%v), was %s", step.name, linkNow, err, linkWas))
				}
				if why := other.home(); why != "" {
					errs = append(errs, fmt.Errorf("after %s the other PF's VF %s: %s", step.name, other, why))
				}
			}
			if err := homeAndClean(v); err != nil {
				errs = append(errs, err)
			}
			// Refused for what it names, not as a damaged file.
			if b, err := os.ReadFile("/tmp/e2e-logs/cni.log"); err != nil || !strings.Contains(string(b), "does not match the kernel") {
				errs = append(errs, fmt.Errorf("the CNI's log does not say the state does not match the kernel (%v)", err))
			}
			if _, err := os.Stat(filepath.Join(cniStateDir, v.addr+".json.bad")); err != nil {
				errs = append(errs, fmt.Errorf("forged state not set aside: %w", err))
			}
			_ = os.Remove(filepath.Join(cniStateDir, v.addr+".json.bad"))
			return errors.Join(errs...)
		}},
	}
}
