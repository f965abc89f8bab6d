package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

const (
	cniBin  = "/opt/cni/bin/sriov"
	cniPath = "/opt/cni/bin"
	cniNet  = "igbnet"
	// cniNodeConfig is the sriov CNI's node config, which every CNI call
	// names in FASTPATH_CNI_NODE_CONFIG (writeCNINodeConfig).
	cniNodeConfig = e2eDir + "/cni-node.json"
)

// cniState is the node the CNI phase expects (the harness's): wire A
// and wire B with 3 VFs each, their first two on igbvf.
func (g *guest) cniState() error {
	if err := os.MkdirAll(cniStateDir, 0o700); err != nil {
		return err
	}
	for _, p := range []*pf{g.wireA, g.wireB} {
		if len(vfsOf(p.addr)) != 3 {
			if err := setNumVFs(p.addr, 3); err != nil {
				return err
			}
		}
		for _, v := range vfsOf(p.addr)[:2] {
			if driverOf(v) != "igbvf" || len(netdevsOf(v)) != 1 {
				if err := setNumVFs(p.addr, 0); err != nil {
					return err
				}
				return setNumVFs(p.addr, 3)
			}
		}
	}
	return nil
}

// The settings igb takes for a VF (ip link set PF vf N …) but mac, all
// at once; cni/add-mac-* add mac (igbvf's answer to a MAC set from the VF
// side depends on it: see there).
var igbSettings = map[string]any{
	"vlan": 100, "vlanQoS": 3, "spoofchk": "off", "trust": "on", "max_tx_rate": 100,
}

// podBSettings are pod B's, on the other wire PF: the same VLAN as pod A.
var podBSettings = map[string]any{"vlan": 100, "spoofchk": "off"}

func cniChecks() []check {
	var (
		vA, vB *vf
		podA   *pod
		podB   *pod
		addA   cmdResult
	)
	return []check{
		// First: cniVF (re)makes the CNI phase's VFs, which would take
		// back a VF a pod of a later check holds.
		{"cni/nad-paths-refused", func(g *guest) error {
			return g.nadPathsRefused()
		}},
		{"cni/add-settings-no-mac", func(g *guest) error {
			// every setting igb takes but mac; the pod stays for CHECK, ping,
			// GC and DEL
			if err := g.needs("setup/pfs"); err != nil {
				return err
			}
			if err := g.cniState(); err != nil {
				return fmt.Errorf("harness: %w", err)
			}
			var err error
			if vA, err = g.newVF(g.wireA, 0); err != nil {
				return err
			}
			if vB, err = g.newVF(g.wireB, 0); err != nil {
				return err
			}
			if podA, err = newPod("pod-a"); err != nil {
				return err
			}
			addA = cniCall{"ADD", "pod-a", podA.path, "net1", conf(vA, "10.99.0.1/24", igbSettings)}.do()
			if addA.err != nil {
				_ = cniCall{"DEL", "pod-a", podA.path, "net1", conf(vA, "10.99.0.1/24", igbSettings)}.do()
				return errors.Join(fmt.Errorf("ADD %s: %s", vA, addA), podA.del())
			}
			s, err := vA.now()
			if err != nil {
				return err
			}
			i := s.pf
			if i.Vlan != 100 || i.Qos != 3 || i.Spoofchk || i.Trust != 1 || i.MaxTxRate != 100 {
				return fmt.Errorf("on the PF after ADD: %s; want vlan 100 qos 3 spoofchk off trust on max_tx_rate 100", s)
			}
			if s.name != "" {
				return fmt.Errorf("the VF's netdev %s is still in the init netns after ADD", s.name)
			}
			r := podA.exec(30*time.Second, "/sbin/ip", "-o", "addr", "show", "dev", "net1")
			if r.err != nil || !strings.Contains(r.stdout, "10.99.0.1/24") {
				return fmt.Errorf("net1 in the pod: %s", r)
			}
			return nil
		}},
		{"cni/check", func(g *guest) error {
			if err := g.needs("cni/add-settings-no-mac"); err != nil {
				return err
			}
			var prev map[string]any
			if err := json.Unmarshal([]byte(addA.stdout), &prev); err != nil {
				return fmt.Errorf("ADD's result: %w", err)
			}
			c := conf(vA, "10.99.0.1/24", igbSettings)
			c["prevResult"] = prev
			if r := (cniCall{"CHECK", "pod-a", podA.path, "net1", c}).do(); r.err != nil {
				return fmt.Errorf("CHECK: %s", r)
			}
			return nil
		}},
		{"cni/status", func(g *guest) error {
			if err := g.needs("setup/pfs"); err != nil {
				return err
			}
			c := map[string]any{"cniVersion": "1.1.0", "name": cniNet, "type": "sriov", "stateDir": cniStateDir,
				"ipam": map[string]any{"type": "static"}}
			if r := (cniCall{command: "STATUS", conf: c}).do(); r.err != nil {
				return fmt.Errorf("STATUS: %s", r)
			}
			return nil
		}},
		{"cni/attach-second-pod", func(g *guest) error {
			if err := g.needs("cni/add-settings-no-mac"); err != nil {
				return err
			}
			var err error
			if podB, err = newPod("pod-b"); err != nil {
				return err
			}
			if r := (cniCall{"ADD", "pod-b", podB.path, "net1", conf(vB, "10.99.0.2/24", podBSettings)}).do(); r.err != nil {
				_ = cniCall{"DEL", "pod-b", podB.path, "net1", conf(vB, "10.99.0.2/24", podBSettings)}.do()
				return errors.Join(fmt.Errorf("ADD %s: %s", vB, r), podB.del())
			}
			return nil
		}},
		{"cni/ping-across-pfs", func(g *guest) error {
			if err := g.needs("cni/attach-second-pod"); err != nil {
				return err
			}
			// VFs of two PFs on one QEMU hub: the pods' traffic crosses the
			// wire. igbvf's link comes up a moment after the move: wait for
			// net1's carrier in both pods, then ping (a few tries, bounded)
			for _, p := range []*pod{podA, podB} {
				err := waitFor(20*time.Second, func() error {
					if r := p.exec(10*time.Second, "/bin/cat", "/sys/class/net/net1/carrier"); strings.TrimSpace(r.stdout) != "1" {
						return fmt.Errorf("net1 in %s: no carrier (%s)", p.name, strings.TrimSpace(r.String()))
					}
					return nil
				})
				if err != nil {
					return err
				}
			}
			var r cmdResult
			err := waitFor(30*time.Second, func() error {
				r = podA.exec(30*time.Second, "/bin/busybox", "ping", "-c", "2", "-W", "2", "10.99.0.2")
				return r.err
			})
			if err != nil {
				na := podA.exec(10*time.Second, "/sbin/ip", "neigh", "show", "dev", "net1")
				return fmt.Errorf("ping from pod-a (%s) to pod-b (%s), VLAN 100: %s (pod-a's neighbours: %s)", vA, vB, r, oneLine(na.stdout))
			}
			logf("%s", strings.TrimSpace(lastLine(r.stdout)))
			return nil
		}},
		{"cni/gc", func(g *guest) error {
			if err := g.needs("cni/attach-second-pod"); err != nil {
				return err
			}
			c := conf(vA, "", nil)
			delete(c, "deviceID")
			c["ipam"] = map[string]any{"type": "static"}
			c["cni.dev/valid-attachments"] = []map[string]string{{"containerID": "pod-a", "ifname": "net1"}}
			r := cniCall{command: "GC", conf: c}.do()
			var errs []error
			if r.err != nil {
				errs = append(errs, fmt.Errorf("GC: %s", r))
			}
			// pod-b's attachment is not valid: torn down; pod-a's kept
			if err := homeAndClean(vB); err != nil {
				errs = append(errs, fmt.Errorf("after GC, which does not list pod-b's attachment: %w", err))
				_ = cniCall{"DEL", "pod-b", podB.path, "net1", conf(vB, "10.99.0.2/24", podBSettings)}.do()
			}
			if s, _ := vA.now(); s.name != "" {
				errs = append(errs, fmt.Errorf("GC took %s (a valid attachment) back: its netdev %s is in the init netns", vA, s.name))
			}
			return errors.Join(append(errs, podB.del())...)
		}},
		{"cni/del-restores", func(g *guest) error {
			if err := g.needs("cni/add-settings-no-mac"); err != nil {
				return err
			}
			if r := (cniCall{"DEL", "pod-a", podA.path, "net1", conf(vA, "10.99.0.1/24", igbSettings)}).do(); r.err != nil {
				return errors.Join(fmt.Errorf("DEL: %s", r), podA.del())
			}
			err := errors.Join(podA.del(), homeAndClean(vA))
			return err
		}},
		{"cni/add-mac-and-vlan", func(g *guest) error {
			// mac and vlan, as most NADs have it
			return g.addMAC(map[string]any{"mac": "02:00:00:e2:0e:01", "vlan": 100})
		}},
		{"cni/add-mac-trusted-all-settings", func(g *guest) error {
			// mac with every other setting igb takes, trust on among them
			return g.addMAC(map[string]any{"mac": "02:00:00:e2:0e:02", "vlan": 100, "vlanQoS": 3, "spoofchk": "off", "trust": "on", "max_tx_rate": 100})
		}},
		{"cni/refuses-link_state", func(g *guest) error {
			return g.refused("link_state", map[string]any{"link_state": "enable", "vlan": 100})
		}},
		{"cni/refuses-min_tx_rate", func(g *guest) error {
			return g.refused("min_tx_rate", map[string]any{"min_tx_rate": 10, "max_tx_rate": 100, "vlan": 100})
		}},
		{"cni/pod-netns-deleted-before-del", func(g *guest) error {
			v, err := g.cniVF(g.wireA, 1)
			if err != nil {
				return err
			}
			p, err := newPod("pod-c")
			if err != nil {
				return err
			}
			c := conf(v, "10.99.0.3/24", map[string]any{"vlan": 300, "spoofchk": "off"})
			if r := (cniCall{"ADD", "pod-c", p.path, "net1", c}).do(); r.err != nil {
				return fmt.Errorf("ADD %s: %s", v, r)
			}
			if err := p.del(); err != nil {
				return err
			}
			// the kernel hands the VF back to the init netns (asynchronously)
			// under its pod name; DEL finds it and puts it back as it was
			if r := (cniCall{"DEL", "pod-c", p.path, "net1", c}).do(); r.err != nil {
				return fmt.Errorf("DEL after the pod's netns was deleted: %s", r)
			}
			return homeAndClean(v)
		}},
		{"cni/sigkill-add", func(g *guest) error { return g.killLoop("ADD", 60, 40) }},
		{"cni/sigkill-del", func(g *guest) error { return g.killLoop("DEL", 50, 50) }},
		{"cni/del-overtakes-add", func(g *guest) error { return g.delOvertakesAdd(80) }},
	}
}

// addMAC runs ADD with a mac (and extra) on a VF, checks the MAC on the
// PF and on net1 in the pod, then DEL, and that the VF is back. igb keeps
// the MAC set on the PF as the VF's administrative MAC, and igbvf asks
// the PF for a MAC set from the VF side: igb refuses it while an
// administrative MAC is set ("VF N attempted to override administratively
// set MAC address", EADDRNOTAVAIL on the VF, in dmesg.txt), so a CNI that
// sets the MAC on the PF and then on the netdev fails here; the netdev has
// to take the MAC from its PF (a VF reset) instead.
func (g *guest) addMAC(extra map[string]any) error {
	v, err := g.cniVF(g.wireA, 1)
	if err != nil {
		return err
	}
	p, err := newPod("pod-m")
	if err != nil {
		return err
	}
	mac := extra["mac"].(string)
	c := conf(v, "10.99.0.5/24", extra)
	r := cniCall{"ADD", "pod-m", p.path, "net1", c}.do()
	var errs []error
	if r.err != nil {
		errs = append(errs, fmt.Errorf("ADD with %v: %s", extra, r))
	} else {
		if s, _ := v.now(); s.pf.Mac.String() != mac {
			errs = append(errs, fmt.Errorf("on the PF: %s, want mac %s", s, mac))
		}
		if m := p.exec(30*time.Second, "/bin/cat", "/sys/class/net/net1/address"); strings.TrimSpace(m.stdout) != mac {
			errs = append(errs, fmt.Errorf("net1's MAC in the pod: %s, want %s", strings.TrimSpace(m.String()), mac))
		}
	}
	if r := (cniCall{"DEL", "pod-m", p.path, "net1", c}).do(); r.err != nil {
		errs = append(errs, fmt.Errorf("DEL: %s", r))
	}
	errs = append(errs, p.del(), homeAndClean(v))
	return errors.Join(errs...)
}

// refused checks that ADD with a setting igb refuses fails naming the
// setting and the driver's answer, and changes nothing.
func (g *guest) refused(setting string, extra map[string]any) error {
	v, err := g.cniVF(g.wireA, 1)
	if err != nil {
		return err
	}
	p, err := newPod("pod-r")
	if err != nil {
		return err
	}
	defer p.del()
	r := cniCall{"ADD", "pod-r", p.path, "net1", conf(v, "10.99.0.4/24", extra)}.do()
	if r.err == nil {
		_ = cniCall{"DEL", "pod-r", p.path, "net1", conf(v, "10.99.0.4/24", extra)}.do()
		return fmt.Errorf("ADD with %s succeeded; igb does not take it", setting)
	}
	msg := r.stdout + r.stderr
	logf("ADD with %s: %s", setting, oneLine(msg))
	if !strings.Contains(msg, setting) && !strings.Contains(msg, strings.ReplaceAll(setting, "_", " ")) {
		return fmt.Errorf("the error does not name %s: %s", setting, oneLine(msg))
	}
	if !strings.Contains(strings.ToLower(msg), "not supported") && !strings.Contains(strings.ToLower(msg), "invalid argument") {
		return fmt.Errorf("the error does not give the driver's answer: %s", oneLine(msg))
	}
	// a runtime sends DEL after a failed ADD; nothing must have changed before it
	if err := homeAndClean(v); err != nil {
		return fmt.Errorf("after the refused ADD: %w", err)
	}
	return nil
}

// nadPathsRefused is issue 44's findings 1 to 3 on a real kernel: a conf
// whose stateDir is a directory anyone may write (a pod's emptyDir on
// the host) holding a planted state and a .netns link to the init netns,
// a CNIDeviceInfoFile outside the node's device-info directory, a
// logFile outside the node's logDir. Each ADD is refused (code 7 for the
// conf's paths; the logFile is only ignored, so the plugin's own netns as
// CNI_NETNS refuses that one, code 8, after the log is set up) and its
// DEL exits 0, with the VF home, every host link under its name, and the
// planted directory as it was (no log file made in it).
func (g *guest) nadPathsRefused() error {
	v, err := g.cniVF(g.wireA, 1)
	if err != nil {
		return err
	}
	if why := v.home(); why != "" {
		return fmt.Errorf("harness: VF %s is not home before the check: %s", v.addr, why)
	}
	dir, err := os.MkdirTemp("", "emptydir-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	planted := map[string]string{
		v.addr + ".json": `{"version":2,"phase":"added","pciAddress":"` + v.addr + `","hostName":"dev7","linkMoved":true}`,
		"victim":         "the node's own file",
	}
	for name, data := range planted {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o666); err != nil {
			return err
		}
	}
	if err := os.Symlink("/proc/1/ns/net", filepath.Join(dir, v.addr+".netns")); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return err
	}
	links := func() string {
		ents, _ := os.ReadDir("/sys/class/net")
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return strings.Join(names, " ")
	}
	linksBefore := links()
	p, err := newPod("pod-hostile")
	if err != nil {
		return err
	}
	defer p.del()
	for _, tc := range []struct {
		name  string
		netns string
		extra map[string]any
		code  int
	}{
		{"stateDir in a world-writable dir", p.path, map[string]any{"stateDir": dir}, 7},
		{"CNIDeviceInfoFile outside the device-info dir", p.path, map[string]any{"runtimeConfig": map[string]any{"CNIDeviceInfoFile": filepath.Join(dir, "victim")}}, 7},
		{"logFile outside the log dir", "/proc/self/ns/net", map[string]any{"logFile": filepath.Join(dir, "cni.log")}, 8},
	} {
		c := conf(v, "", tc.extra)
		r := cniCall{"ADD", "pod-hostile", tc.netns, "net1", c}.do()
		var e struct {
			Code int `json:"code"`
		}
		_ = json.Unmarshal([]byte(r.stdout), &e)
		if r.err == nil || e.Code != tc.code {
			_ = cniCall{"DEL", "pod-hostile", tc.netns, "net1", c}.do()
			return fmt.Errorf("%s: ADD gave %s; want code %d", tc.name, r, tc.code)
		}
		if r := (cniCall{"DEL", "pod-hostile", tc.netns, "net1", c}).do(); r.err != nil {
			return fmt.Errorf("%s: DEL of the refused ADD: %s", tc.name, r)
		}
		if why := v.home(); why != "" {
			return fmt.Errorf("%s: the VF is not home: %s", tc.name, why)
		}
		if now := links(); now != linksBefore {
			return fmt.Errorf("%s: host links %s, were %s", tc.name, now, linksBefore)
		}
		ents, _ := os.ReadDir(dir)
		if len(ents) != 3 {
			return fmt.Errorf("%s: the planted dir holds %d entries, want its 3", tc.name, len(ents))
		}
		for name, data := range planted {
			if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != data {
				return fmt.Errorf("%s: %s changed: %q, %v", tc.name, name, b, err)
			}
		}
	}
	return nil
}
