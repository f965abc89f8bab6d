package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
)

// standIn is one VF of the fixture host: its PCI side is a fixture
// function, its netdev the veth of that name, its RDMA device the rxe
// device of that name.
type standIn struct {
	PCIAddress string
	Netdev     string
	MAC        string
	RDMA       string // "" for none
}

// hostPF is the fixture PF the stand-ins are VFs of: a ConnectX-6 Dx
// whose own netdev and RDMA device do not exist (the CNI touches the PF
// only for VF settings, which the check does not ask for).
const hostPF = "0000:5e:00.0"

// vfAddress is the PCI address of VF i of hostPF.
func vfAddress(i int) string { return fixture.PCIAddress(0, 0x5e, 0, 2+i) }

// writeHost (re)writes the fixture host at root as the kernel is now: a
// VF's RDMA device is there while kernel (the kernel's /sys) has it, and
// its ports directory is the kernel's own (an absolute link), so that
// whoever reads the VF's port state and GID table reads the kernel's.
// The host's /sys/module is the kernel's too, and its boot_id the
// running kernel's, so that doctor knows it may ask the kernel (RDMA
// netlink, addresses) about this host.
func writeHost(root, kernel string, vfs []standIn) error {
	if err := os.RemoveAll(root); err != nil {
		return fmt.Errorf("fixture host %s: %w", root, err)
	}
	b, err := fixture.NewBuilder(root)
	if err != nil {
		return fmt.Errorf("fixture host %s: %w", root, err)
	}
	pf := fixture.Function{
		Address: hostPF, Vendor: "15b3", Device: "101d", Class: "0x020000", Driver: "mlx5_core",
		IOMMUGroup: 40, Parent: "pci0000:5d", TotalVFs: 8,
		Netdevs: []fixture.Netdev{{Name: "fprcpf0", MAC: fixture.MAC(0x5e, 0), PhysPortName: "p0"}},
	}
	var links []standIn
	for i, v := range vfs {
		vf := fixture.Function{
			Address: v.PCIAddress, Vendor: "15b3", Device: "101e", Class: "0x020000", Driver: "mlx5_core",
			IOMMUGroup: 41 + i, Netdevs: []fixture.Netdev{{Name: v.Netdev, MAC: v.MAC}},
		}
		if v.RDMA != "" && exists(filepath.Join(kernel, "class", "infiniband", v.RDMA)) {
			vf.RDMA = []fixture.RDMADevice{{Name: v.RDMA, LinkLayer: "Ethernet", Uverbs: -1, Umad: -1, NodeGUID: fixture.GUID(0x5e, i+1)}}
			links = append(links, v)
		}
		pf.VFs = append(pf.VFs, vf)
	}
	if err := b.Add(pf); err != nil {
		return err
	}
	for _, v := range links {
		ports := filepath.Join(root, "sys", "bus", "pci", "devices", v.PCIAddress, "infiniband", v.RDMA, "ports")
		if err := os.RemoveAll(ports); err != nil {
			return err
		}
		if err := os.Symlink(filepath.Join(kernel, "class", "infiniband", v.RDMA, "ports"), ports); err != nil {
			return fmt.Errorf("fixture host: %s ports: %w", v.RDMA, err)
		}
	}
	if err := os.Symlink(filepath.Join(kernel, "module"), filepath.Join(root, "sys", "module")); err != nil {
		return fmt.Errorf("fixture host: sys/module: %w", err)
	}
	const bootID = "proc/sys/kernel/random/boot_id"
	id, err := os.ReadFile("/" + bootID)
	if err != nil {
		return fmt.Errorf("fixture host: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(bootID)), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(root, bootID), id, 0o644)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, fs.ErrNotExist)
}
