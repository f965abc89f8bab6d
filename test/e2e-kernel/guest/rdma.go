package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// setNetnsMode is `rdma system set netns MODE`; the kernel refuses it
// (EBUSY) while any netns but the initial one exists, and a netns that
// just went away leaves from a work queue: EBUSY is retried for a while.
func setNetnsMode(mode string) error {
	return waitFor(10*time.Second, func() error {
		err := netlink.RdmaSystemSetNetnsMode(mode)
		if err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("rdma system set netns %s: %w (not retried)", mode, err)
		}
		return err
	})
}

// rdmaLinks lists the RDMA devices RDMA netlink shows in a netns
// (rdma link show, by name), through iproute2's rdma in that netns.
func rdmaDevices(netnsName string) (map[string]string, error) {
	args := []string{"-j", "link", "show"}
	name := "/usr/bin/rdma"
	if netnsName != "" {
		args = append([]string{"netns", "exec", netnsName, name}, args...)
		name = "/sbin/ip"
	}
	r := run(30*time.Second, nil, "", name, args...)
	if r.err != nil {
		return nil, fmt.Errorf("rdma link show: %s", r)
	}
	var links []struct {
		Ifname string `json:"ifname"`
		State  string `json:"state"`
		Netdev string `json:"netdev"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &links); err != nil {
		return nil, fmt.Errorf("rdma -j link show: %w: %q", err, r.stdout)
	}
	out := map[string]string{}
	for _, l := range links {
		out[strings.SplitN(l.Ifname, "/", 2)[0]] = l.State + " " + l.Netdev
	}
	return out, nil
}

// addRxe makes an rxe device over netdev (in netnsName, "" for the
// init netns) and waits for its port to be ACTIVE.
func addRxe(netnsName, dev, netdev string) error {
	args := []string{"link", "add", dev, "type", "rxe", "netdev", netdev}
	name := "/usr/bin/rdma"
	if netnsName != "" {
		args = append([]string{"netns", "exec", netnsName, name}, args...)
		name = "/sbin/ip"
	}
	if r := run(30*time.Second, nil, "", name, args...); r.err != nil {
		return fmt.Errorf("rdma link add %s type rxe netdev %s: %s", dev, netdev, r)
	}
	return waitFor(15*time.Second, func() error {
		d, err := rdmaDevices(netnsName)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(d[dev], "ACTIVE") {
			return fmt.Errorf("%s: %q, want ACTIVE", dev, d[dev])
		}
		return nil
	})
}

func rdmaChecks() []check {
	var v *vf
	const rxe = "rxe0"
	return []check{
		{"rdma/rxe-on-vf", func(g *guest) error {
			if err := g.needs("setup/pfs"); err != nil {
				return err
			}
			// rdma_rxe needs crc32_generic first on 6.12 (else rxe_newlink:
			// ENOENT); 7.x has no such module (crc32 is built-in library code)
			if !kernelModuleListed("/etc/e2e-modules-absent", "crc32_generic") {
				if err := modprobe("crc32_generic"); err != nil {
					return err
				}
			}
			if err := modprobe("rdma_rxe", "ib_uverbs", "rdma_ucm"); err != nil {
				return err
			}
			if err := g.cniState(); err != nil {
				return fmt.Errorf("harness: %w", err)
			}
			var err error
			if v, err = g.newVF(g.wireB, 1); err != nil {
				return err
			}
			if err := ipCmd("link", "set", v.orig.name, "up"); err != nil {
				return err
			}
			if err := addRxe("", rxe, v.orig.name); err != nil {
				return err
			}
			if _, err := os.Stat("/dev/infiniband/uverbs0"); err != nil {
				return err
			}
			logf("%s over %s (%s): ACTIVE, /dev/infiniband/uverbs0", rxe, v.orig.name, v)
			return nil
		}},
		{"rdma/doctor", func(g *guest) error {
			if err := g.needs("rdma/rxe-on-vf"); err != nil {
				return err
			}
			mode, err := netlink.RdmaSystemGetNetnsMode()
			if err != nil {
				return err
			}
			if err := writePools(); err != nil {
				return err
			}
			name, argv := asDaemonSet(baseCaps, "doctor", "-o", "json", "--config", filepath.Join(e2eDir, "pools.json"),
				"--kubelet-dir", "", "--cni-bin-dir", "", "--cni-conf-dir", "")
			r := run(2*time.Minute, nil, "", name, argv...)
			appendLog("doctor.json", r.stdout+r.stderr)
			var out struct {
				Checks []struct {
					Name, Status, Subject, Message, Fix string
				} `json:"checks"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
				return fmt.Errorf("doctor -o json: %w (%s)", err, r)
			}
			var netns []string
			for _, c := range out.Checks {
				if c.Status != "ok" {
					logf("doctor: %s %s [%s] %s", c.Status, c.Name, c.Subject, oneLine(c.Message))
				}
				if c.Name == "rdma-netns" {
					netns = append(netns, c.Status+" "+c.Subject+": "+c.Message)
					if c.Status == "ok" && c.Subject == "RDMA netlink" && strings.HasPrefix(c.Message, mode) {
						return nil
					}
				}
			}
			return fmt.Errorf("doctor's rdma-netns finding is not the kernel's mode %q from RDMA netlink: %v (exit: %v)", mode, netns, r.err)
		}},
		{"rdma/cni-isolation-without-rdma-device", func(g *guest) error {
			// rdmaIsolation on a VF with no RDMA device of its own (an rxe
			// device over its netdev is no PCI function's): refused before
			// anything changes, naming why
			if err := g.needs("rdma/rxe-on-vf"); err != nil {
				return err
			}
			p, err := newPod("pod-rs")
			if err != nil {
				return err
			}
			defer p.del()
			c := conf(v, "10.97.0.1/24", map[string]any{"rdmaIsolation": true})
			r := cniCall{"ADD", "pod-rs", p.path, "net1", c}.do()
			_ = cniCall{"DEL", "pod-rs", p.path, "net1", c}.do()
			if r.err == nil {
				return errors.New("ADD with rdmaIsolation succeeded on a VF without an RDMA device")
			}
			if !strings.Contains(r.stdout+r.stderr, "no RDMA device") {
				return fmt.Errorf("the error does not say the VF has no RDMA device: %s", oneLine(r.stdout))
			}
			logf("ADD with rdmaIsolation: %s", oneLine(r.stdout))
			return homeAndClean(v)
		}},
		{"rdma/cni-shared-mode", func(g *guest) error {
			if err := g.needs("rdma/rxe-on-vf"); err != nil {
				return err
			}
			return g.rdmaAttach(v, rxe, "shared")
		}},
		{"rdma/cni-exclusive-mode", func(g *guest) error {
			if err := g.needs("rdma/rxe-on-vf"); err != nil {
				return err
			}
			return g.rdmaAttach(v, rxe, "exclusive")
		}},
	}
}

// rdmaAttach runs ADD and DEL on a VF with an rxe device over its netdev
// in one RDMA netns mode. The kernel cannot move rxe with its netdev (an
// rxe device is no PCI function's and has no disassociate support): when
// the netdev leaves the init netns, rdma_rxe deletes the device. ADD and
// DEL must still succeed and leave the VF as it was; an rxe created in
// the pod over net1 reaches ACTIVE there.
func (g *guest) rdmaAttach(v *vf, rxe, mode string) error {
	// the kernel switches the mode only while no netns but the initial one
	// exists: a pod an earlier failed check left behind is deleted first
	if ents, _ := os.ReadDir("/run/netns"); len(ents) > 0 {
		for _, e := range ents {
			logf("deleting netns %s, left by an earlier check, to switch the RDMA netns mode", e.Name())
			_ = ipCmd("netns", "del", e.Name())
		}
	}
	if err := setNetnsMode(mode); err != nil {
		return err
	}
	if d, _ := rdmaDevices(""); !strings.HasPrefix(d[rxe], "ACTIVE") {
		if err := addRxe("", rxe, v.orig.name); err != nil {
			return err
		}
	}
	p, err := newPod("pod-rdma")
	if err != nil {
		return err
	}
	c := conf(v, "10.97.0.2/24", map[string]any{"vlan": 400})
	r := cniCall{"ADD", "pod-rdma", p.path, "net1", c}.do()
	var errs []error
	if r.err != nil {
		errs = append(errs, fmt.Errorf("ADD in %s mode: %s", mode, r))
	} else {
		d, err := rdmaDevices("")
		switch {
		case err != nil:
			errs = append(errs, err)
		case d[rxe] != "":
			errs = append(errs, fmt.Errorf("%s is still listed after its netdev left for the pod: %s (rdma_rxe deletes it on 6.12)", rxe, d[rxe]))
		default:
			logf("%s mode: %s went with its netdev: rdma_rxe deleted it (the kernel's answer: rxe cannot follow a netdev into a netns)", mode, rxe)
		}
		// an rxe made from inside the pod over net1: in shared mode every
		// netns sees it; in exclusive mode a new RDMA device belongs to
		// the initial netns, whatever netns asked for it
		where := p.name
		if mode == "exclusive" {
			where = ""
		}
		if r := p.exec(30*time.Second, "/usr/bin/rdma", "link", "add", "rxepod", "type", "rxe", "netdev", "net1"); r.err != nil {
			errs = append(errs, fmt.Errorf("rdma link add rxepod type rxe netdev net1 in the pod: %s", r))
		} else if err := waitFor(15*time.Second, func() error {
			d, err := rdmaDevices(where)
			if err != nil {
				return err
			}
			if !strings.HasPrefix(d["rxepod"], "ACTIVE") {
				return fmt.Errorf("rxepod in the %s netns: %q, want ACTIVE", orInit(where), d["rxepod"])
			}
			return nil
		}); err != nil {
			inPod, _ := rdmaDevices(p.name)
			inInit, _ := rdmaDevices("")
			errs = append(errs, fmt.Errorf("%w (pod lists %v, init lists %v)", err, inPod, inInit))
		} else {
			logf("%s mode: rxepod over net1, made in the pod: ACTIVE, listed in the %s netns", mode, orInit(where))
		}
	}
	if r := (cniCall{"DEL", "pod-rdma", p.path, "net1", c}).do(); r.err != nil {
		errs = append(errs, fmt.Errorf("DEL in %s mode: %s", mode, r))
	}
	errs = append(errs, p.del())
	errs = append(errs, homeAndClean(v))
	return errors.Join(errs...)
}

func orInit(netnsName string) string {
	if netnsName == "" {
		return "initial"
	}
	return netnsName
}
