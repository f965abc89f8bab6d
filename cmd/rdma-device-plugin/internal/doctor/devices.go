package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fastpath-k8s/fastpath/internal/words"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// module is a kernel module NCCL's path to the NIC needs.
type module struct {
	name string
	// missing is the verdict when it is not loaded.
	missing Status
	// evidence is a sysfs path (below /sys) that exists when the module's
	// work is there: a module built into the kernel may have no
	// /sys/module entry.
	evidence string
	why      string
}

// ConnectX's modules, and the RDMA core every RDMA driver needs.
var (
	mlx5Modules = []module{
		{"mlx5_core", Fail, "bus/pci/drivers/mlx5_core", "the ConnectX driver: no netdevs, VFs or RDMA devices without it"},
		{"mlx5_ib", Fail, "class/infiniband/mlx5_*", "no ConnectX RDMA devices (mlx5_N): NCCL logs \"NET/IB : No device found\" and uses sockets"},
	}
	coreModules = []module{
		{"ib_uverbs", Fail, "class/infiniband_verbs/uverbs*", "no /dev/infiniband/uverbsN, the device NCCL opens"},
		{"ib_umad", Warn, "class/infiniband_mad/umad*", "no umadN/issmN, which ibstat, UCX and subnet-manager tools need (NCCL does not)"},
		{"rdma_ucm", Warn, "class/misc/rdma_cm", "no /dev/infiniband/rdma_cm, which RDMA CM users (UCX, MPI) need and the plugin gives every pod"},
	}
)

// rdmaEvidence is where an RDMA driver built into the kernel shows: the
// auxiliary driver it registers (irdma's has no name of its own,
// bnxt_re's is "rdma": drivers/base/auxiliary.c names them
// <module>[.<name>]).
var rdmaEvidence = map[string]string{
	"irdma":   "bus/auxiliary/drivers/irdma",
	"bnxt_re": "bus/auxiliary/drivers/bnxt_re.rdma",
}

// modules are the kernel modules the node's functions need: mlx5_core and
// mlx5_ib where it has ConnectX functions; the drivers other vendors'
// functions are bound to, the VF driver of a family whose VFs are bound to
// none, and the RDMA drivers planRDMA found needed; the RDMA core where
// any RDMA is.
func (h *host) modules() []module {
	var out []module
	have := func(name string) bool { return slices.ContainsFunc(out, func(m module) bool { return m.name == name }) }
	if slices.ContainsFunc(h.snap.Devices, func(d nic.Device) bool { return isConnectX(&d) }) {
		out = append(out, mlx5Modules...)
	}
	unbound := map[string][]string{} // VF driver -> its unbound VFs
	var vfDrivers []string
	for i := range h.snap.Devices {
		d := &h.snap.Devices[i]
		if isConnectX(d) || d.IsVFIO() {
			continue
		}
		f, known := h.familyOf(d)
		if d.Driver == "" {
			if known && d.IsVF() {
				if unbound[f.VFDriver] == nil {
					vfDrivers = append(vfDrivers, f.VFDriver)
				}
				unbound[f.VFDriver] = append(unbound[f.VFDriver], d.PCIAddress)
			}
			continue
		}
		if have(d.Driver) {
			continue
		}
		what := "the driver of the node's vendor " + d.Vendor + " functions"
		if known {
			what = "the " + f.Name + " driver"
		}
		out = append(out, module{d.Driver, Fail, "bus/pci/drivers/" + d.Driver, what + ": no netdevs or VFs on its functions without it"})
	}
	for _, drv := range vfDrivers {
		if !have(drv) {
			out = append(out, module{drv, Warn, "bus/pci/drivers/" + drv,
				fmt.Sprintf("%s bound to no driver (%s would take them): no netdevs on them", plural(len(unbound[drv]), "VF is", "VFs are"), drv)})
		}
	}
	for _, f := range h.rdmaFamilies {
		if f.Name == connectX.Name || have(f.RDMADriver) {
			continue
		}
		ev := rdmaEvidence[f.RDMADriver]
		if ev == "" {
			ev = "module/" + f.RDMADriver
		}
		out = append(out, module{f.RDMADriver, Fail, ev,
			fmt.Sprintf("no RDMA devices on the %s functions (%s): NCCL logs \"NET/IB : No device found\" and uses sockets", f.Name, f.Drivers())})
	}
	if h.rdmaCore {
		out = append(out, coreModules...)
	}
	return out
}

func (h *host) checkModules() {
	var loaded []string
	connectXNode := slices.ContainsFunc(h.snap.Devices, func(d nic.Device) bool { return isConnectX(&d) })
	for _, m := range h.modules() {
		dir := h.sys("module", m.name)
		if _, err := os.Stat(dir); err == nil {
			if st, err := read(filepath.Join(dir, "initstate")); err == nil && st != "live" {
				h.addf("kernel-module", Warn, m.name, "wait, or check dmesg for "+m.name+" errors",
					"%s is %q, not live: it is being loaded or unloaded right now", m.name, st)
				continue
			}
			loaded = append(loaded, m.name)
			continue
		}
		if found, _ := filepath.Glob(h.sys(m.evidence)); len(found) > 0 {
			loaded = append(loaded, m.name+" (built in)")
			continue
		}
		fix := fmt.Sprintf("modprobe %s, and load it at boot (echo %s >> /etc/modules-load.d/rdma.conf)", m.name, m.name)
		// The NVIDIA network operator's driver container loads mlx5 and
		// the RDMA core, not other vendors' drivers.
		if connectXNode && (strings.HasPrefix(m.name, "mlx5_") || slices.ContainsFunc(coreModules, func(c module) bool { return c.name == m.name })) {
			fix += "; with the NVIDIA network operator, check its driver container"
		}
		h.addf("kernel-module", m.missing, m.name, fix,
			"%s is not loaded (no /sys/module/%s): %s", m.name, m.name, m.why)
	}
	if len(loaded) > 0 {
		h.add("kernel-module", OK, strings.Join(loaded, ", "), "loaded", "")
	}
	if !h.rdmaCore {
		why := "no function here has an RDMA device or can have one"
		if h.opts.Config != nil {
			why = "no pool asks for an RDMA device (isRdma, or a shared pool) on a function that can have one"
		}
		if fams := h.noRDMAFamilies(); len(fams) > 0 {
			why += "; " + strings.Join(fams, " and ") + " have no RDMA in the kernel"
		}
		h.add("kernel-module", Skip, "ib_uverbs, ib_umad, rdma_ucm", "RDMA modules not checked: "+why, "")
	}
}

// classDev is a char device as sysfs registers it.
type classDev struct {
	name, ibdev, devno string // "uverbs14", "mlx5_12", "231:206"
}

// classDevs lists the RDMA char devices sysfs knows, by RDMA device.
func (h *host) classDevs() map[string][]classDev {
	out := map[string][]classDev{}
	for _, class := range []string{"infiniband_verbs", "infiniband_mad"} {
		ents, _ := os.ReadDir(h.sys("class", class))
		for _, e := range ents {
			ibdev, err := read(h.sys("class", class, e.Name(), "ibdev"))
			if err != nil {
				continue // abi_version and being-removed entries
			}
			devno, err := read(h.sys("class", class, e.Name(), "dev"))
			if err != nil {
				continue
			}
			out[ibdev] = append(out[ibdev], classDev{name: e.Name(), ibdev: ibdev, devno: devno})
		}
	}
	return out
}

func (h *host) checkCharDevices() {
	const name = "char-device"
	if !h.rdmaCore {
		return // no RDMA here, nor asked for: the modules check says so
	}
	devDir := filepath.Join(h.root, rdma.DevDir)
	if _, err := os.Stat(devDir); err != nil {
		h.addf(name, Fail, devDir, "modprobe "+strings.TrimSpace(h.rdmaDriverNames()+" ib_uverbs")+"; in the plugin's pod, the DaemonSet mounts the node's /dev/infiniband",
			"%s does not exist: no RDMA char devices at all, so no pod can open an HCA", devDir)
		return
	}
	byIB := h.classDevs()
	type finding struct{ ibdevs, details []string }
	found := map[string]*finding{}
	var kinds []string
	note := func(kind, ibdev, detail string) {
		f := found[kind]
		if f == nil {
			f = &finding{}
			found[kind] = f
			kinds = append(kinds, kind)
		}
		if !slices.Contains(f.ibdevs, ibdev) {
			f.ibdevs = append(f.ibdevs, ibdev)
		}
		f.details = append(f.details, detail)
	}
	expected, checked, standIns := 0, 0, 0
	known := map[string]bool{}
	for _, devs := range byIB {
		for _, c := range devs {
			known[c.name] = true
		}
	}
	for _, d := range h.targets {
		if d.RDMADevice == "" {
			continue
		}
		checked++
		devs := byIB[d.RDMADevice]
		hasUverbs := false
		for _, c := range devs {
			expected++
			hasUverbs = hasUverbs || strings.HasPrefix(c.name, rdma.KindUverbs)
			if kind, detail := nodeProblem(devDir, c.name, c.devno); kind != "" {
				if h.standIn(devDir, c.name, kind) {
					standIns++
					continue
				}
				note(kind, d.RDMADevice, detail)
			}
		}
		if !hasUverbs {
			note("no uverbs in sysfs", d.RDMADevice, d.RDMADevice)
		}
	}
	if cm, err := read(h.sys("class", "misc", "rdma_cm", "dev")); err == nil {
		known["rdma_cm"] = true
		expected++
		if kind, detail := nodeProblem(devDir, "rdma_cm", cm); h.standIn(devDir, "rdma_cm", kind) {
			standIns++
		} else if kind != "" {
			note(kind, "rdma_cm", detail)
		}
	}
	present, _ := os.ReadDir(devDir)
	if expected > 0 && len(present) == 0 {
		h.addf(name, Fail, devDir,
			"in the plugin's pod: kubectl -n fastpath delete pod <the node's rdma-device-plugin pod> (its new pod mounts the current directory); on the node: udevadm trigger --subsystem-match=infiniband_verbs --subsystem-match=infiniband_mad --action=add",
			"%s is empty but sysfs lists %s: if this runs in a container, the node's RDMA modules were reloaded after it started and its mount still holds the old, emptied directory (the stale /dev after a driver reload)",
			devDir, plural(expected, "char device", "char devices"))
		return
	}
	for _, kind := range kinds {
		f := found[kind]
		details := words.List(f.details, 6)
		var st Status = Fail
		var msg, fix string
		switch kind {
		case "missing":
			msg = details + ": in sysfs but missing under " + devDir + "; a pod given them fails to start"
			fix = "on the node: udevadm trigger --subsystem-match=infiniband_verbs --subsystem-match=infiniband_mad --action=add; in the plugin's pod after a driver reload: restart the pod"
		case "not a char device":
			msg = details + ": not char devices (a copied or hand-made /dev, not the kernel's)"
			fix = "mount the node's devtmpfs /dev/infiniband (hostPath) instead of a copy"
		case "stale":
			msg = details + ": stale, made before a driver reload renumbered the devices; a pod given it would open another HCA"
			fix = "recreate the nodes: udevadm trigger --subsystem-match=infiniband_verbs --subsystem-match=infiniband_mad --action=add; then restart the plugin's pod"
		case "no uverbs in sysfs":
			msg = details + ": no uverbsN in sysfs (ib_uverbs is not loaded or did not bind them)"
			fix = "modprobe ib_uverbs"
		default:
			st, msg, fix = Warn, details+": not readable", "run doctor as root"
		}
		h.add(name, st, words.List(f.ibdevs, 4), msg, fix)
	}
	if extra := extraNodes(present, known); len(extra) > 0 && expected > 0 {
		h.addf(name, Warn, devDir, "remove them: they name no device (udevadm trigger recreates the real ones)",
			"%s under %s: no device of that name in sysfs (left over from before a driver reload?)", words.List(extra, 6), devDir)
	}
	switch {
	case len(kinds) == 0 && checked > 0 && standIns > 0:
		h.addf(name, OK, devDir, "", "%s: every uverbs/umad/issm node and rdma_cm present; %s of the fixture stand in for char devices",
			plural(checked, "RDMA device", "RDMA devices"), plural(standIns, "empty file", "empty files"))
	case len(kinds) == 0 && checked > 0:
		h.addf(name, OK, devDir, "", "%s: every uverbs/umad/issm node matches the major:minor sysfs gives; rdma_cm present",
			plural(checked, "RDMA device", "RDMA devices"))
	}
}

// standIn says <devDir>/<node>, which nodeProblem found to be no char
// device, is a fixture's empty file standing in for one.
func (h *host) standIn(devDir, node, kind string) bool {
	if !h.opts.Fixture || kind != "not a char device" {
		return false
	}
	fi, err := os.Lstat(filepath.Join(devDir, node))
	return err == nil && fi.Mode().IsRegular() && fi.Size() == 0
}

// extraNodes are uverbs/umad/issm nodes sysfs does not know.
func extraNodes(present []os.DirEntry, known map[string]bool) []string {
	var out []string
	for _, e := range present {
		n := e.Name()
		if _, ok := rdma.CharKind(n); !ok || known[n] {
			continue
		}
		out = append(out, n)
	}
	return out
}
