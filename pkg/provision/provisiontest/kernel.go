// Package provisiontest plays the kernel over a fixture host
// (internal/testsupport/fixture), since this machine has no SR-IOV PF to change: Host
// is what the PCI core and the VF drivers do to the host's sysfs (its doc
// lists the kernel behaviours modelled and where each was checked);
// Kernel is a fake provision.Kernel that calls it, and Standin calls it
// when a process writes the host's attribute files.
package provisiontest

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// Kernel changes a fixture host under Root through Host, one call at a
// time, with the kernel behaviours Host lists. VFs appear on the bus when
// sriov_numvfs is written; a VF bound to a netdev driver shows its netdev
// (and, for mlx5_core, its RDMA device) ProbeDelay later, as a driver's
// probe does after the write returned.
type Kernel struct {
	Root       string // as given to New
	ProbeDelay time.Duration

	mu       sync.Mutex // guards the fields below and the tree
	guids    map[string]net.HardwareAddr
	calls    []string
	failNext map[string]error
	probes   sync.WaitGroup
	host     Host
}

var _ provision.Kernel = (*Kernel)(nil)

// New returns a fake over the host at root.
func New(root string) *Kernel {
	return &Kernel{Root: root, guids: map[string]net.HardwareAddr{}, failNext: map[string]error{}, host: Host{Root: root}}
}

// Calls are the calls made, in order ("SetNumVFs 0000:18:00.0 8").
func (k *Kernel) Calls() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.calls...)
}

// FailNext makes the next call of method fail with err.
func (k *Kernel) FailNext(method string, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.failNext[method] = err
}

// Wait waits for the probes still to come.
func (k *Kernel) Wait() { k.probes.Wait() }

// GUID is the GUID set for VF vf of pf, nil when none.
func (k *Kernel) GUID(pf string, vf int) net.HardwareAddr {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.guids[pf+"/"+strconv.Itoa(vf)]
}

func (k *Kernel) call(method string, args ...any) error {
	s := method
	for _, a := range args {
		s += " " + fmt.Sprint(a)
	}
	k.calls = append(k.calls, s)
	if err, ok := k.failNext[method]; ok {
		delete(k.failNext, method)
		return err
	}
	return nil
}

func (k *Kernel) dev(addr string, attr ...string) string {
	return filepath.Join(append([]string{k.Root, "sys", "bus", "pci", "devices", addr}, attr...)...)
}

func writeErr(path string, errno syscall.Errno) error {
	return &fs.PathError{Op: "write", Path: path, Err: errno}
}

// SetNumVFs does what the PCI core does (Host.SetNumVFs); VFs the PF's
// driver binds (autoprobe) are probed ProbeDelay later.
func (k *Kernel) SetNumVFs(pf string, n int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("SetNumVFs", pf, n); err != nil {
		return err
	}
	vfs, err := k.host.SetNumVFs(pf, n)
	if err != nil {
		return err
	}
	for i, vf := range vfs {
		k.probe(pf, i, vf)
	}
	return nil
}

// probe adds the VF's netdev and RDMA device ProbeDelay from now; the
// caller holds k.mu.
func (k *Kernel) probe(pf string, i int, vf string) {
	guid := k.guids[pf+"/"+strconv.Itoa(i)]
	if k.ProbeDelay <= 0 {
		_ = k.host.Probe(vf, guid)
		return
	}
	k.probes.Add(1)
	time.AfterFunc(k.ProbeDelay, func() {
		defer k.probes.Done()
		k.mu.Lock()
		defer k.mu.Unlock()
		_ = k.host.Probe(vf, guid)
	})
}

// SetAutoprobe writes sriov_drivers_autoprobe.
func (k *Kernel) SetAutoprobe(pf string, on bool) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("SetAutoprobe", pf, on); err != nil {
		return err
	}
	v := "0\n"
	if on {
		v = "1\n"
	}
	return os.WriteFile(k.dev(pf, "sriov_drivers_autoprobe"), []byte(v), 0o644)
}

// SetVFGUID keeps the GUID; the VF's RDMA device shows it once probed.
func (k *Kernel) SetVFGUID(pf, pfNetdev string, vf int, guid net.HardwareAddr) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("SetVFGUID", pf, pfNetdev, vf, guid); err != nil {
		return err
	}
	if n, _ := readInt(k.dev(pf, "sriov_numvfs")); vf >= n {
		return fmt.Errorf("pci %s: VF %d: %w", pf, vf, syscall.EINVAL)
	}
	k.guids[pf+"/"+strconv.Itoa(vf)] = guid
	return nil
}

// Unbind unbinds the function.
func (k *Kernel) Unbind(addr string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("Unbind", addr); err != nil {
		return err
	}
	return k.host.Unbind(addr)
}

// Bind writes driver_override (driver, or cleared for
// provision.DriverByID) and then drivers_probe, as the SysfsKernel does,
// through Host.DriversProbe: with the PF's autoprobe 0 and no override
// nothing binds, and Bind still succeeds. A netdev driver's probe adds
// the netdev ProbeDelay later.
func (k *Kernel) Bind(addr, driver string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("Bind", addr, driver); err != nil {
		return err
	}
	override := driver
	if driver == provision.DriverByID {
		override = "(null)"
	}
	if err := os.WriteFile(k.dev(addr, "driver_override"), []byte(override+"\n"), 0o644); err != nil {
		return fmt.Errorf("pci %s: write driver_override: %w", addr, err)
	}
	_, probe, err := k.host.DriversProbe(addr)
	if err != nil || !probe {
		return err
	}
	pf, i, err := k.host.VF(addr)
	if err != nil {
		return err
	}
	k.probe(pf, i, addr)
	return nil
}

// SetMTU writes the netdev's mtu.
func (k *Kernel) SetMTU(netdev string, mtu int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("SetMTU", netdev, mtu); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(k.Root, "sys", "class", "net", netdev, "mtu"), []byte(strconv.Itoa(mtu)+"\n"), 0o644)
}
