package soak

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// unconfigured is a VF nobody changed, as mlx5 (and the file-backed PF)
// reports it.
var unconfigured = sriov.VFConfig{MAC: "00:00:00:00:00:00", SpoofChk: true, Proto: sriov.VlanProto8021Q}

// leaks looks, between cycles (no attachment alive), for anything an
// attachment left: a VF stand-in not back under its own name, MAC, MTU and
// up state, with no alias; a stray link; a VF setting not restored; an RDMA
// device not back in the host netns; a netns; a pinned netns mount; a
// state, lock or temporary file; an IPAM lease; a device-info file.
// allowDown are VFs whose netdev may come back down (their state file was
// destroyed, and with it whether it was up).
func (w *world) leaks(allowDown map[*vf]bool) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	ls := links()
	known := map[string]bool{"lo": true}
	for _, v := range w.vfs {
		known[v.netdev], known[v.peer] = true, true
		l, ok := ls[v.netdev]
		if !ok {
			add("%s: %s is not on the host", v.addr, v.netdev)
		} else {
			a := l.Attrs()
			if a.HardwareAddr.String() != v.mac || a.MTU != v.mtu || a.Alias != "" {
				add("%s: %s has MAC %s MTU %d alias %q, want %s %d \"\"", v.addr, v.netdev, a.HardwareAddr, a.MTU, a.Alias, v.mac, v.mtu)
			}
			if a.Flags&net.FlagUp == 0 && !allowDown[v] {
				add("%s: %s is down", v.addr, v.netdev)
			}
		}
		c, set, err := w.pfConfig(v)
		switch {
		case err != nil:
			add("%s: PF %s settings unreadable: %v", v.addr, v.pf, err)
		case set:
			if c.GUID == v.guid {
				c.GUID = ""
			}
			if c != unconfigured {
				add("%s: VF settings on PF %s not restored: %+v", v.addr, v.pf, c)
			}
		}
	}
	for name := range ls {
		if !known[name] {
			add("stray link %s on the host", name)
		}
	}
	if b, err := os.ReadFile(w.rdmaFile); err == nil && strings.TrimSpace(string(b)) != "{}" && len(b) > 0 {
		add("RDMA devices not back in the host netns: %s", b)
	}
	ents, _ := os.ReadDir(testnet.NetnsDir)
	for _, e := range ents {
		if _, ours := w.pods[e.Name()]; !ours {
			add("netns %s left", e.Name())
		}
	}
	for _, m := range nsMounts(w.stateDir) {
		add("pinned netns still mounted at %s", m)
	}
	for _, dir := range []string{w.stateDir, w.devinfo} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			// A tombstone (deleted-*.json: a DEL that found no attachment)
			// is no leak: it refuses a late ADD of its attachment and
			// expires after ten minutes (docs/cni.md).
			tombstone := strings.HasPrefix(e.Name(), "deleted-") && strings.HasSuffix(e.Name(), ".json")
			if e.Name() != "filler" && !strings.HasSuffix(e.Name(), ".json.bad") && !tombstone {
				add("%s left in %s", e.Name(), dir)
			}
		}
	}
	ents, _ = os.ReadDir(filepath.Join(w.ipamDir, "soak"))
	for _, e := range ents {
		if net.ParseIP(e.Name()) != nil {
			add("IPAM lease %s left", e.Name())
		}
	}
	return out
}

// nsMounts are the nsfs mounts under dir (pinned namespaces).
func nsMounts(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID parent major:minor root mountpoint options ... - fstype source super
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, x := range fields {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if fields[sep+1] == "nsfs" && strings.HasPrefix(fields[4], dir+"/") {
			out = append(out, fields[4])
		}
	}
	return out
}

// repair puts the world back after a leak, so that later cycles start
// clean and are judged on their own.
func (w *world) repair() {
	for _, m := range nsMounts(w.stateDir) {
		_ = unmount(m)
	}
	for _, dir := range []string{w.stateDir, w.devinfo, w.pfDir} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	_ = os.Remove(w.rdmaFile)
	ents, _ := os.ReadDir(filepath.Join(w.ipamDir, "soak"))
	for _, e := range ents {
		if net.ParseIP(e.Name()) != nil {
			_ = os.Remove(filepath.Join(w.ipamDir, "soak", e.Name()))
		}
	}
	known := map[string]bool{"lo": true}
	for _, v := range w.vfs {
		known[v.netdev], known[v.peer] = true, true
	}
	for name, l := range links() {
		if !known[name] {
			_ = netlink.LinkDel(l)
		}
	}
	ls := links()
	for _, v := range w.vfs {
		l, ok := ls[v.netdev]
		if !ok || l.Attrs().HardwareAddr.String() != v.mac || l.Attrs().MTU != v.mtu || l.Attrs().Alias != "" {
			w.standIn(v)
		} else if l.Attrs().Flags&net.FlagUp == 0 {
			_ = netlink.LinkSetUp(l)
		}
	}
	ents, _ = os.ReadDir(testnet.NetnsDir)
	for _, e := range ents {
		if _, ours := w.pods[e.Name()]; !ours {
			w.gone(&pod{ns: e.Name()})
		}
	}
}

func unmount(path string) error {
	if err := syscallUnmount(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
