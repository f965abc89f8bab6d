package provision

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// Why a PF is refused.
var (
	// ErrBusy: a VF that would go or be rebound is in use.
	ErrBusy = errors.New("VFs in use")
	// ErrTotalVFs: numVfs is above the PF's sriov_totalvfs.
	ErrTotalVFs = errors.New("numVfs above sriov_totalvfs")
	// ErrFirmware: the PF has SR-IOV off in its firmware.
	ErrFirmware = errors.New("SR-IOV off in the firmware")
	// ErrLinkType: the policy wants another link type than the port has.
	ErrLinkType = errors.New("link type differs")
	// ErrGUID: no GUID can be given to an InfiniBand VF.
	ErrGUID = errors.New("no GUID for an InfiniBand VF")
)

// StepKind names one kernel write.
type StepKind string

// The steps, each one Kernel method.
const (
	StepMTU       StepKind = "set PF MTU"
	StepAutoprobe StepKind = "set sriov_drivers_autoprobe"
	StepNumVFs    StepKind = "write sriov_numvfs"
	StepUnbind    StepKind = "unbind VF"
	StepGUID      StepKind = "set VF node/port GUID"
	StepBind      StepKind = "bind VF"
	StepWait      StepKind = "wait for VF"
)

// Step is one change. VF is the VF's index (-1 for a PF step); its
// address is read when the step runs, since VFs a plan creates do not
// exist when it is made.
type Step struct {
	Kind  StepKind
	VF    int
	N     int              // StepNumVFs: the count; StepMTU: the MTU; StepAutoprobe: 0 or 1
	GUID  net.HardwareAddr // StepGUID
	Drv   string           // StepBind: vfio-pci or DriverByID; StepWait: what the VF waits for, "netdev", "netdev+rdma", "vfio-pci"
	Owner string           // StepWait: the policy the VF is for
}

func (s Step) String() string {
	switch s.Kind {
	case StepMTU, StepAutoprobe, StepNumVFs:
		return fmt.Sprintf("%s %d", s.Kind, s.N)
	case StepGUID:
		return fmt.Sprintf("%s %d %s", s.Kind, s.VF, s.GUID)
	case StepBind:
		if s.Drv == DriverByID {
			return fmt.Sprintf("%s %d to the driver its IDs match", s.Kind, s.VF)
		}
		return fmt.Sprintf("%s %d to %s", s.Kind, s.VF, s.Drv)
	case StepWait:
		return fmt.Sprintf("%s %d: %s", s.Kind, s.VF, s.Drv)
	}
	return fmt.Sprintf("%s %d", s.Kind, s.VF)
}

func readAttr(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// guidOf parses a node_guid ("b83f:d203:0018:0000") into 8 bytes.
func guidOf(s string) net.HardwareAddr {
	h := strings.ReplaceAll(s, ":", "")
	if len(h) != 16 {
		return nil
	}
	g := make(net.HardwareAddr, 8)
	for i := range g {
		v, err := strconv.ParseUint(h[2*i:2*i+2], 16, 8)
		if err != nil {
			return nil
		}
		g[i] = byte(v)
	}
	return g
}

// DeriveGUID is the GUID of VF vf of the PF whose node GUID is pf: the
// first 8 bytes of SHA-256(pf, vf), made locally administered (the EUI-64
// U/L bit set, the group bit clear). The same PF and index give the same
// GUID on every boot; PF GUIDs are unique per port, so the GUIDs of a
// node's VFs differ (NewPlan checks that they do).
func DeriveGUID(pf net.HardwareAddr, vf int) net.HardwareAddr {
	var in [10]byte
	copy(in[:8], pf)
	binary.BigEndian.PutUint16(in[8:], uint16(vf))
	sum := sha256.Sum256(in[:])
	g := net.HardwareAddr(slices.Clone(sum[:8]))
	g[0] = g[0]&0xfc | 0x02
	return g
}

// rdmaGUID reads the node GUID of an RDMA device.
func rdmaGUID(root, dev string) net.HardwareAddr {
	if dev == "" {
		return nil
	}
	return guidOf(readAttr(filepath.Join(root, "sys", "class", "infiniband", dev, "node_guid")))
}

// wantGUID is the GUID VF k of pf gets: the admin's, else the derived.
func wantGUID(pol *Policy, pf *PF, pfGUID net.HardwareAddr, k int) net.HardwareAddr {
	if pol != nil {
		for _, key := range []string{pf.Netdev, pf.Address} {
			if list := pol.GUIDs[key]; k < len(list) {
				return list[k]
			}
		}
	}
	if pfGUID == nil {
		return nil
	}
	return DeriveGUID(pfGUID, k)
}

// planSteps fills pf.Steps (or pf.Refused) from what the node has.
func planSteps(pf *PF, node Node, pol *Policy) {
	sys := filepath.Join(node.Root, "sys", "bus", "pci", "devices", pf.Address)
	var pfDev *nic.Device
	vfs := map[int]*nic.Device{}
	for i := range node.Snapshot.Devices {
		d := &node.Snapshot.Devices[i]
		switch {
		case d.PCIAddress == pf.Address:
			pfDev = d
		case d.PFAddress == pf.Address:
			vfs[d.VFIndex] = d
		}
	}
	if pf.External {
		if pf.NumVFs < pf.Want {
			pf.Warnings = append(pf.Warnings, fmt.Sprintf("externally managed by policy %s: the PF has %d VFs, the policy wants %d; create them yourself (fastpath writes nothing here)", pf.Policy, pf.NumVFs, pf.Want))
		}
		return
	}
	ib := pf.LinkType == rdma.LinkLayerInfiniBand
	var pfGUID net.HardwareAddr
	if pfDev != nil {
		pfGUID = rdmaGUID(node.Root, pfDev.RDMADevice)
	}
	if pf.MTU > 0 && pf.Netdev != "" {
		if cur := readAttr(filepath.Join(node.Root, "sys", "class", "net", pf.Netdev, "mtu")); cur != strconv.Itoa(pf.MTU) {
			pf.Steps = append(pf.Steps, Step{Kind: StepMTU, VF: -1, N: pf.MTU})
		}
	}
	autoprobe := readAttr(filepath.Join(sys, "sriov_drivers_autoprobe")) != "0"
	rec, interrupted := node.Records[pf.Address]
	pf.Autoprobe = autoprobe
	if interrupted {
		// The run that stopped may have left autoprobe as it set it; its
		// record says what it found (1, the kernel's default, when the
		// record does not say).
		pf.Autoprobe = rec.Autoprobe == nil || *rec.Autoprobe
	}
	// The VF steps come in groups: the count (autoprobe off first, so
	// that no driver takes the new VFs before their GUIDs are set or
	// their override is written), unbinds, GUIDs (while every VF is
	// unbound), vfio-pci binds (driver_override, which the PCI core
	// probes whatever autoprobe is), then autoprobe on and the binds to
	// the driver each VF's IDs match, and autoprobe as it is to be left.
	var vfSteps, unbinds, guids, vfio, byID []Step
	cur := autoprobe
	bind := func(k int) {
		drv := pf.driverOf(k)
		wait := Step{Kind: StepWait, VF: k, Drv: DriverVFIO, Owner: pf.PolicyOf(k)}
		if drv == DriverVFIO {
			vfio = append(vfio, Step{Kind: StepBind, VF: k, Drv: drv}, wait)
			return
		}
		if ib {
			guids = append(guids, Step{Kind: StepGUID, VF: k, GUID: wantGUID(pol, pf, pfGUID, k)})
		}
		wait.Drv = "netdev"
		if g := pf.groupOf(k); g != nil && g.IsRdma {
			wait.Drv = "netdev+rdma"
		}
		byID = append(byID, Step{Kind: StepBind, VF: k, Drv: drv}, wait)
	}
	var touched []string // existing VFs the steps unbind or remove
	// A VF that sriov_numvfs counts but the bus lacks (hot-removed through
	// its remove attribute, or a probe that failed) comes back only with
	// the PF's VFs made again: N -> 0 -> N.
	var missing []int
	for k := 0; pf.NumVFs == pf.Want && k < pf.Want; k++ {
		if vfs[k] == nil {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		pf.Warnings = append(pf.Warnings, fmt.Sprintf("VFs %v of %s are not on the PCI bus although sriov_numvfs is %d: its VFs are made again (%d -> 0 -> %d)", missing, pf.Address, pf.NumVFs, pf.NumVFs, pf.Want))
	}
	if pf.NumVFs != pf.Want || len(missing) > 0 {
		switch {
		case pf.TotalVFs == 0 && pf.Want > 0:
			how := "in the NIC's firmware or the BIOS"
			if pf.Vendor == "15b3" {
				how = fmt.Sprintf("in the firmware (mlxconfig -d %s set SRIOV_EN=1 NUM_OF_VFS=%d)", pf.Address, pf.Want)
			}
			pf.Refused = fmt.Errorf("%w: PF %s has sriov_totalvfs 0: enable SR-IOV %s and reboot", ErrFirmware, pf.Address, how)
			return
		case pf.Want > pf.TotalVFs:
			how := "lower numVfs"
			if pf.Vendor == "15b3" {
				how = "raise NUM_OF_VFS in the firmware with mlxconfig, or lower numVfs"
			}
			pf.Refused = fmt.Errorf("%w: policy %s wants numVfs %d but PF %s has sriov_totalvfs %d (%s)", ErrTotalVFs, pf.Policy, pf.Want, pf.Address, pf.TotalVFs, how)
			return
		}
		for _, d := range vfs {
			touched = append(touched, d.PCIAddress)
		}
		if pf.Want > 0 && cur {
			vfSteps = append(vfSteps, Step{Kind: StepAutoprobe, VF: -1, N: 0})
			cur = false
		}
		if pf.NumVFs > 0 {
			// The PCI core refuses N -> M with both non-zero, whatever
			// the driver (EBUSY, sriov_numvfs_store in drivers/pci/iov.c).
			vfSteps = append(vfSteps, Step{Kind: StepNumVFs, VF: -1, N: 0})
		}
		if pf.Want > 0 {
			vfSteps = append(vfSteps, Step{Kind: StepNumVFs, VF: -1, N: pf.Want})
			for k := 0; k < pf.Want; k++ {
				bind(k)
			}
		}
	} else {
		for k := 0; k < pf.Want; k++ {
			d := vfs[k]
			drv := pf.driverOf(k)
			switch {
			case d.Driver == "":
				bind(k)
			case (drv == DriverVFIO) != (d.Driver == DriverVFIO):
				// A netdevice VF is bound to whatever driver its IDs
				// matched; only vfio-pci is the wrong one for it.
				touched = append(touched, d.PCIAddress)
				unbinds = append(unbinds, Step{Kind: StepUnbind, VF: k})
				bind(k)
			case ib && drv == DriverByID && d.RDMADevice != "" && !slices.Equal(rdmaGUID(node.Root, d.RDMADevice), wantGUID(pol, pf, pfGUID, k)):
				touched = append(touched, d.PCIAddress)
				unbinds = append(unbinds, Step{Kind: StepUnbind, VF: k})
				bind(k)
			}
		}
	}
	vfSteps = append(vfSteps, unbinds...)
	vfSteps = append(vfSteps, guids...)
	vfSteps = append(vfSteps, vfio...)
	if len(byID) > 0 && !cur {
		vfSteps = append(vfSteps, Step{Kind: StepAutoprobe, VF: -1, N: 1})
		cur = true
	}
	vfSteps = append(vfSteps, byID...)
	if cur != pf.Autoprobe {
		vfSteps = append(vfSteps, Step{Kind: StepAutoprobe, VF: -1, N: map[bool]int{false: 0, true: 1}[pf.Autoprobe]})
	}
	for _, s := range vfSteps {
		if s.Kind == StepGUID && s.GUID == nil {
			pf.Refused = fmt.Errorf("%w: PF %s has no RDMA device to read its node GUID from, and policy %s gives no GUIDs for it (annotation %s)", ErrGUID, pf.Address, pf.Policy, GUIDsAnnotation)
			return
		}
	}
	if err := busy(pf, touched, node.InUse); err != nil {
		pf.Refused = err
		return
	}
	pf.Steps = append(pf.Steps, vfSteps...)
}

func (pf *PF) groupOf(k int) *Group {
	for i := range pf.Groups {
		if pf.Groups[i].contains(k) {
			return &pf.Groups[i]
		}
	}
	return nil
}

// busy refuses a PF whose touched VFs are in use, naming who holds them.
func busy(pf *PF, touched []string, inUse map[string]string) error {
	slices.Sort(touched)
	var held []string
	for _, a := range touched {
		if who, ok := inUse[a]; ok {
			held = append(held, a+" ("+who+")")
		}
	}
	if len(held) == 0 {
		return nil
	}
	return fmt.Errorf("%w: policy %s would change the VFs of PF %s (sriov_numvfs %d -> %d), but %s in use: %s; nothing changed, retried when they are free",
		ErrBusy, pf.Policy, pf.Address, pf.NumVFs, pf.Want, map[bool]string{true: "this VF is", false: "these VFs are"}[len(held) == 1], strings.Join(held, ", "))
}

// checkGUIDs refuses the PFs whose VFs would get a GUID another VF of the
// plan gets.
func checkGUIDs(plan *Plan) {
	seen := map[string]string{}
	for i := range plan.PFs {
		pf := &plan.PFs[i]
		for _, s := range pf.Steps {
			if s.Kind != StepGUID {
				continue
			}
			who := fmt.Sprintf("VF %d of %s", s.VF, pf.Address)
			if prev, ok := seen[s.GUID.String()]; ok {
				pf.Refused = fmt.Errorf("%w: GUID %s for %s is %s's too", ErrGUID, s.GUID, who, prev)
				pf.Steps = nil
				break
			}
			seen[s.GUID.String()] = who
		}
	}
}
