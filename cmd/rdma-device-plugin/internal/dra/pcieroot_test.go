package dra_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

// helperPCIeRoot is deviceattribute's own lookup of a function's root
// complex (through the sysfs at sys; "" = the default, /sys), or "" when
// it finds none.
func helperPCIeRoot(t *testing.T, sys, addr string) string {
	t.Helper()
	var mods []deviceattribute.MachineModifier
	if sys != "" {
		mods = append(mods, deviceattribute.WithFSFromRoot(sys))
	}
	a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(addr, mods...)
	if err != nil {
		return ""
	}
	require.NotNil(t, a.Value.StringValue)
	require.Equal(t, deviceattribute.StandardDeviceAttributePCIeRoot, a.Name)
	return *a.Value.StringValue
}

// The pcieRoot fastpath publishes comes from its own scan; it must be
// exactly what the Kubernetes helper reads (a stand-in GPU driver using
// the helper must see the same root), on every fixture host.
func TestPCIeRootMatchesDeviceAttribute(t *testing.T) {
	for _, name := range fixture.Names() {
		t.Run(name, func(t *testing.T) {
			root := fixtureRoot(name)
			snap, err := nic.NewScanner(root).Scan()
			require.NoError(t, err)
			require.NotEmpty(t, snap.Devices)
			known := 0
			for i := range snap.Devices {
				d := &snap.Devices[i]
				want := helperPCIeRoot(t, filepath.Join(root, "sys"), d.PCIAddress)
				require.Equal(t, want, d.PCIeRoot, d.PCIAddress)
				if want != "" {
					known++
				}
			}
			require.Equal(t, len(snap.Devices), known, "every fixture function hangs off a PCI host bridge")
		})
	}
}

// The DGX fixture's GPUs share a root with their rail's NIC: what a claim
// aligning a GPU and a VF relies on.
func TestDGXGPUsShareTheirRailsRoot(t *testing.T) {
	root := fixtureRoot("dgx-h100")
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	for _, r := range fixture.DGXRails {
		vf, ok := snap.Device(fixture.VFAddress(r.Bus, 0))
		require.True(t, ok)
		gpu := fixture.PCIAddress(0, r.Bus+1, 0, 0)
		require.Equal(t, helperPCIeRoot(t, filepath.Join(root, "sys"), gpu), vf.PCIeRoot, "rail %#x", r.Bus)
	}
}

const pcieRootChild = "FASTPATH_TEST_PCIEROOT_SYS"

// TestPCIeRootMatchesDeviceAttributeOnSlashSys runs the helper the way a
// GPU driver on the node does — reading /sys itself, no modifier — with
// the DGX fixture bind-mounted over /sys in a private mount namespace.
// Root only.
func TestPCIeRootMatchesDeviceAttributeOnSlashSys(t *testing.T) {
	if sys := os.Getenv(pcieRootChild); sys != "" {
		pcieRootInChild(t, sys)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: bind-mounts a fixture over /sys in a private mount namespace")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare(1) from util-linux")
	}
	root, err := filepath.Abs(fixtureRoot("dgx-h100"))
	require.NoError(t, err)
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	want := map[string]string{}
	var addrs []string
	for i := range snap.Devices {
		want[snap.Devices[i].PCIAddress] = snap.Devices[i].PCIeRoot
		addrs = append(addrs, snap.Devices[i].PCIAddress)
	}
	for _, r := range fixture.DGXRails {
		addrs = append(addrs, fixture.PCIAddress(0, r.Bus+1, 0, 0)) // the GPUs
	}
	out := filepath.Join(t.TempDir(), "roots.json")
	in, err := json.Marshal(addrs)
	require.NoError(t, err)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0],
		"-test.run", "^TestPCIeRootMatchesDeviceAttributeOnSlashSys$", "-test.count", "1")
	cmd.Env = append(os.Environ(), pcieRootChild+"="+filepath.Join(root, "sys"), "FASTPATH_TEST_PCIEROOT_IN="+string(in), "FASTPATH_TEST_PCIEROOT_OUT="+out)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "child: %s", b)
	data, err := os.ReadFile(out)
	require.NoError(t, err, "child wrote no result: %s", b)
	var got map[string]string
	require.NoError(t, json.Unmarshal(data, &got))
	for addr, w := range want {
		require.NotEmpty(t, w, addr)
		require.Equal(t, w, got[addr], addr)
	}
	for _, r := range fixture.DGXRails {
		require.Equal(t, want[fixture.VFAddress(r.Bus, 0)], got[fixture.PCIAddress(0, r.Bus+1, 0, 0)], "GPU of rail %#x", r.Bus)
	}
}

func pcieRootInChild(t *testing.T, sys string) {
	require.NoError(t, unix.Mount(sys, "/sys", "", unix.MS_BIND|unix.MS_REC, ""))
	var addrs []string
	require.NoError(t, json.Unmarshal([]byte(os.Getenv("FASTPATH_TEST_PCIEROOT_IN")), &addrs))
	got := map[string]string{}
	for _, a := range addrs {
		got[a] = helperPCIeRoot(t, "", a)
	}
	data, err := json.Marshal(got)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(os.Getenv("FASTPATH_TEST_PCIEROOT_OUT"), data, 0o644))
}
