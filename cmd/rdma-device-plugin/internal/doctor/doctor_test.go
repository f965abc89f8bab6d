package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

var (
	sharedMu sync.Mutex // guards shared
	shared   = map[string]string{}
)

// newHost returns a fixture host with faults applied. A host without
// faults is only read, so tests share one: the committed tree of a named
// host, one generated tree for the others.
func newHost(t *testing.T, name string, faults ...func(root string) error) string {
	t.Helper()
	if len(faults) == 0 {
		if _, committed := fixture.Hosts[name]; committed {
			return filepath.Join("..", "..", "..", "..", "testdata", "sysfs", name)
		}
		// A host captured from a real kernel (testdata/sysfs-captured).
		if dir := filepath.Join("..", "..", "..", "..", "testdata", "sysfs-captured", name); isDir(dir) {
			return dir
		}
		sharedMu.Lock()
		defer sharedMu.Unlock()
		if root, ok := shared[name]; ok {
			return root
		}
		root, err := os.MkdirTemp("", "doctor-"+name+"-")
		require.NoError(t, err)
		writeHost(t, root, name)
		shared[name] = root
		return root
	}
	root := t.TempDir()
	writeHost(t, root, name)
	for _, f := range faults {
		require.NoError(t, f(root))
	}
	return root
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

func writeHost(t *testing.T, root, name string) {
	t.Helper()
	switch name {
	case "generate":
		require.NoError(t, fixture.Generate(root, 2, 2))
	case "generate-novfs":
		require.NoError(t, fixture.Generate(root, 1, 0))
	default:
		if build, ok := vendorHosts[name]; ok {
			b, err := fixture.NewBuilder(root)
			require.NoError(t, err)
			require.NoError(t, build(b))
			return
		}
		require.NoError(t, fixture.Write(root, name))
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, dir := range shared {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// realDevices makes the host's /dev/infiniband nodes real char devices,
// as on a node; it skips the test without root.
func realDevices(t *testing.T) func(string) error {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("char devices need mknod: run as root (CI does)")
	}
	return fixture.MakeCharDevices
}

func config(t *testing.T, js string) *pool.Config {
	t.Helper()
	cfg, err := pool.Parse([]byte(js))
	require.NoError(t, err)
	return cfg
}

// Configs the tests use.
const (
	// generate: PFs 0000:10:00.0 (ibp16s0) and 0000:11:00.0, 2 VFs each (101e).
	genConfig = `{"resourceList":[{"resourceName":"rails","selectors":{"vendors":["15b3"],"devices":["101e"],"drivers":["mlx5_core"],"isRdma":true}}]}`
	// roce-cx6dx: 2 PFs 101d, 4 VFs 101e each.
	roceConfig = `{"resourceList":[{"resourceName":"roce","selectors":{"devices":["101e"],"drivers":["mlx5_core"],"isRdma":true}}],
		"configList":[{"resourceName":"hcas","resourcePrefix":"rdma","rdmaHcaMax":10,"selectors":{"deviceIDs":["101d"]}}]}`
	// edge: PF 0000:86:00.0 (ibp134s0) with VFs vfio-pci, unbound, ok, no RDMA (101c).
	edgeConfig = `{"resourceList":[{"resourceName":"ib","selectors":{"devices":["101c"],"drivers":["mlx5_core"],"isRdma":true}}]}`
)

func find(r *Report, name string) []Check {
	var out []Check
	for _, c := range r.Checks {
		if c.Name == name {
			out = append(out, c)
		}
	}
	return out
}

// requireCheck asserts a check of that name and status whose subject and
// message together contain every one of want.
func requireCheck(t *testing.T, r *Report, name string, st Status, want ...string) Check {
	t.Helper()
	for _, c := range find(r, name) {
		if c.Status != st {
			continue
		}
		text := c.Subject + " | " + c.Message + " | " + c.Fix
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(text, w)
		}
		if ok {
			return c
		}
	}
	t.Fatalf("no %s check %q with %q; have:\n%s", st, name, want, dump(r))
	return Check{}
}

func requireNo(t *testing.T, r *Report, name string, st Status) {
	t.Helper()
	for _, c := range find(r, name) {
		require.NotEqual(t, st, c.Status, "unexpected %s %s: %s %s\n%s", st, name, c.Subject, c.Message, dump(r))
	}
}

func dump(r *Report) string {
	var b strings.Builder
	for _, c := range r.Checks {
		b.WriteString(string(c.Status) + " " + c.Name + " [" + c.Subject + "] " + c.Message + "\n")
	}
	return b.String()
}

func TestReportOrderAndExitCode(t *testing.T) {
	r := &Report{Checks: []Check{{Name: "a", Status: OK}, {Name: "b", Status: Warn}, {Name: "c", Status: Skip},
		{Name: "d", Status: Fail}, {Name: "e", Status: Warn}}}
	var names []string
	for _, c := range r.Sorted() {
		names = append(names, c.Name)
	}
	require.Equal(t, []string{"d", "b", "e", "c", "a"}, names, "failures first, then warnings, skips, passes; stable")
	require.Equal(t, 2, r.ExitCode())
	require.Equal(t, 1, (&Report{Checks: []Check{{Status: OK}, {Status: Warn}, {Status: Skip}}}).ExitCode())
	require.Equal(t, 0, (&Report{Checks: []Check{{Status: OK}, {Status: Skip}}}).ExitCode())
	require.Equal(t, 2, r.Count(Warn))
}

func TestModules(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults []func(string) error
		st     Status
		want   []string
	}{
		// the edge host's E810 has an irdma device: its modules are checked too
		{"all loaded", nil, OK, []string{"mlx5_core, mlx5_ib, ice, irdma, ib_uverbs, ib_umad, rdma_ucm"}},
		{"mlx5_ib missing", []func(string) error{unload("mlx5_ib")}, Fail, []string{"mlx5_ib", "modprobe mlx5_ib", "NET/IB : No device found"}},
		{"ib_uverbs missing takes mlx5_ib", []func(string) error{unload("ib_uverbs")}, Fail, []string{"ib_uverbs", "modprobe ib_uverbs"}},
		{"ib_umad missing", []func(string) error{unload("ib_umad")}, Warn, []string{"ib_umad", "NCCL does not"}},
		{"rdma_ucm missing", []func(string) error{unload("rdma_ucm")}, Warn, []string{"rdma_ucm", "rdma_cm"}},
		{"built in", []func(string) error{func(root string) error {
			return os.RemoveAll(filepath.Join(root, "sys/module/ib_umad")) // its devices stay: built into the kernel
		}}, OK, []string{"ib_umad (built in)"}},
		{"being unloaded", []func(string) error{func(root string) error {
			return os.WriteFile(filepath.Join(root, "sys/module/mlx5_ib/initstate"), []byte("going\n"), 0o644)
		}}, Warn, []string{"mlx5_ib", `"going"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := newHost(t, "edge", tc.faults...)
			r := Run(Options{HostRoot: root})
			requireCheck(t, r, "kernel-module", tc.st, tc.want...)
		})
	}
}

func unload(m string) func(string) error {
	return func(root string) error { return fixture.UnloadModule(root, m) }
}

func TestCharDevices(t *testing.T) {
	cfg := config(t, edgeConfig)
	t.Run("regular files are not the kernel's devices", func(t *testing.T) {
		r := Run(Options{HostRoot: newHost(t, "edge"), Config: cfg})
		requireCheck(t, r, "char-device", Fail, "mlx5_3", "uverbs3", "not char devices")
	})
	t.Run("no /dev/infiniband", func(t *testing.T) {
		root := newHost(t, "edge", func(root string) error { return os.RemoveAll(filepath.Join(root, "dev/infiniband")) })
		requireCheck(t, Run(Options{HostRoot: root}), "char-device", Fail, "does not exist")
	})
	t.Run("emptied by a driver reload", func(t *testing.T) {
		root := newHost(t, "edge", fixture.EmptyDevDir)
		requireCheck(t, Run(Options{HostRoot: root, Config: cfg}), "char-device", Fail, "is empty", "driver reload", "delete pod")
	})
	t.Run("one node missing", func(t *testing.T) {
		root := newHost(t, "edge", func(root string) error { return os.Remove(filepath.Join(root, "dev/infiniband/issm3")) })
		requireCheck(t, Run(Options{HostRoot: root, Config: cfg}), "char-device", Fail, "mlx5_3", "issm3", "missing")
	})
	t.Run("real devices", func(t *testing.T) {
		root := newHost(t, "edge", realDevices(t))
		r := Run(Options{HostRoot: root, Config: cfg})
		requireCheck(t, r, "char-device", OK, "1 RDMA device")
		requireNo(t, r, "char-device", Fail)
	})
	t.Run("stale major:minor after a reload", func(t *testing.T) {
		root := newHost(t, "edge", realDevices(t), func(root string) error { return fixture.Mknod(root, "uverbs3", 231, 197) })
		requireCheck(t, Run(Options{HostRoot: root, Config: cfg}), "char-device", Fail, "mlx5_3", "uverbs3 is 231:197, sysfs says 231:195", "stale")
	})
	t.Run("leftover node", func(t *testing.T) {
		root := newHost(t, "edge", realDevices(t), func(root string) error { return fixture.Mknod(root, "uverbs42", 231, 234) })
		requireCheck(t, Run(Options{HostRoot: root, Config: cfg}), "char-device", Warn, "uverbs42")
	})
}

func TestPorts(t *testing.T) {
	cfg := config(t, genConfig)
	t.Run("healthy", func(t *testing.T) {
		r := Run(Options{HostRoot: newHost(t, "generate"), Config: cfg})
		requireCheck(t, r, "port", OK, "6 ports ACTIVE", "subnet manager")
	})
	t.Run("PF link down takes its VFs", func(t *testing.T) {
		root := newHost(t, "generate", func(root string) error {
			if err := fixture.SetPortState(root, "mlx5_0", 1, "1: DOWN", "2: Polling"); err != nil {
				return err
			}
			return fixture.SetPortState(root, "mlx5_1", 1, "1: DOWN", "2: Polling") // its VF
		})
		r := Run(Options{HostRoot: root, Config: cfg})
		c := requireCheck(t, r, "port", Fail, "mlx5_0 port 1", "phys_state Polling", "2 VFs", "cable")
		require.NotContains(t, dump(r), "mlx5_1 port 1", "a VF's port down with its PF is said once, on the PF")
		_ = c
	})
	t.Run("disabled", func(t *testing.T) {
		root := newHost(t, "generate", func(root string) error { return fixture.SetPortState(root, "mlx5_3", 1, "1: DOWN", "3: Disabled") })
		requireCheck(t, Run(Options{HostRoot: root, Config: cfg}), "port", Fail, "mlx5_3 port 1", "Disabled")
	})
	t.Run("no subnet manager", func(t *testing.T) {
		root := newHost(t, "generate", func(root string) error { return fixture.LoseSM(root, "mlx5_3", 1) })
		requireCheck(t, Run(Options{HostRoot: root, Config: cfg}), "port", Fail, "mlx5_3 port 1", "state INIT", "sm_lid 0x0", "opensm")
	})
	t.Run("RoCE port down: its netdev", func(t *testing.T) {
		root := newHost(t, "roce-cx6dx", func(root string) error { return fixture.SetPortState(root, "mlx5_1", 1, "1: DOWN", "3: Disabled") })
		requireCheck(t, Run(Options{HostRoot: root, Config: config(t, roceConfig)}), "port", Fail, "mlx5_1 port 1", "ens1f1np1", "ip link set ens1f1np1 up", "4 VFs")
	})
}

// kernel is a Kernel with canned answers.
type fakeKernel struct {
	mode    string
	modeErr error
	addrs   map[string][]string
}

func (k fakeKernel) RDMANetnsMode() (string, error) { return k.mode, k.modeErr }
func (k fakeKernel) IPv4Addrs(n string) ([]string, error) {
	a, ok := k.addrs[n]
	if !ok {
		return nil, ErrNoLink
	}
	return a, nil
}

func TestRoCEGIDs(t *testing.T) {
	cfg := config(t, roceConfig)
	t.Run("GID tables only", func(t *testing.T) {
		r := Run(Options{HostRoot: newHost(t, "roce-cx6dx"), Config: cfg})
		requireNo(t, r, "roce-gid", Fail)
		requireCheck(t, r, "roce-gid", Skip, "10 RoCE netdevs", "not this machine's")
	})
	t.Run("v2 GID of an address gone", func(t *testing.T) {
		// VF0 of PF0 (ens1f0v0, mlx5_2) has 192.168.1.20: v1 at 2, v2 at 3.
		root := newHost(t, "roce-cx6dx", func(root string) error { return fixture.DropGID(root, "mlx5_2", 1, 3) })
		requireCheck(t, Run(Options{HostRoot: root, Config: cfg}), "roce-gid", Fail, "mlx5_2 port 1 (ens1f0v0)", "192.168.1.20", "no RoCE v2 GID")
	})
	t.Run("the kernel knows an address the table lacks", func(t *testing.T) {
		k := fakeKernel{addrs: map[string][]string{"ens1f0np0": {"192.168.1.10"}, "ens1f0v1": {"10.9.9.9"}}}
		r := Run(Options{HostRoot: newHost(t, "roce-cx6dx"), Config: cfg, Kernel: k})
		requireCheck(t, r, "roce-gid", Fail, "ens1f0v1", "10.9.9.9")
		requireNo(t, r, "roce-gid", Skip)
	})
	t.Run("all present", func(t *testing.T) {
		k := fakeKernel{addrs: map[string][]string{"ens1f0np0": {"192.168.1.10"}, "ens1f0v0": {"192.168.1.20"}}}
		r := Run(Options{HostRoot: newHost(t, "roce-cx6dx"), Config: cfg, Kernel: k})
		requireCheck(t, r, "roce-gid", OK, "2 RoCE netdevs", "8 more are in pods")
	})
}

// private makes newHost write a host of the test's own, to change.
func private(string) error { return nil }

func TestNetnsMode(t *testing.T) {
	root := newHost(t, "generate", private)
	setParam := func(v string) {
		require.NoError(t, os.WriteFile(filepath.Join(root, "sys/module/ib_core/parameters/netns_mode"), []byte(v+"\n"), 0o644))
	}
	requireCheck(t, Run(Options{HostRoot: root, Kernel: fakeKernel{mode: ModeExclusive}}), "rdma-netns", OK, "RDMA netlink", "exclusive")
	requireCheck(t, Run(Options{HostRoot: root, Kernel: fakeKernel{mode: ModeShared}}), "rdma-netns", OK, "shared", "netns_mode=0")
	requireCheck(t, Run(Options{HostRoot: root}), "rdma-netns", OK, "netns_mode", "shared")
	setParam("N")
	requireCheck(t, Run(Options{HostRoot: root, Kernel: fakeKernel{modeErr: ErrNoRDMANetlink}}), "rdma-netns", OK, "netns_mode", "exclusive")
	require.NoError(t, os.RemoveAll(filepath.Join(root, "sys/module/ib_core/parameters")))
	requireCheck(t, Run(Options{HostRoot: root, Kernel: fakeKernel{modeErr: ErrNoRDMANetlink}}), "rdma-netns", Skip, "no RDMA netlink")
	requireCheck(t, Run(Options{HostRoot: root}), "rdma-netns", Skip, "not this machine's")
}

func TestSameKernel(t *testing.T) {
	require.True(t, SameKernel("/"))
	require.True(t, SameKernel("//"))
	require.False(t, SameKernel(newHost(t, "edge")), "a fixture is not this machine")
	id, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	require.NoError(t, err)
	root := t.TempDir()
	p := filepath.Join(root, "proc/sys/kernel/random/boot_id")
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, id, 0o444))
	require.True(t, SameKernel(root), "the node's / mounted elsewhere (kubectl debug node's /host)")
	require.NoError(t, os.WriteFile(p, []byte("00000000-0000-0000-0000-000000000000\n"), 0o444))
	require.False(t, SameKernel(root))
	// The node's sysfs mounted under the root, as in the plugin's pod.
	root = t.TempDir()
	require.NoError(t, os.Symlink("/sys", filepath.Join(root, "sys")))
	require.True(t, SameKernel(root))
}

// TestRealKernel asks this machine's kernel: a machine without RDMA (this
// project's CI) has no RDMA netlink and says so; one with it answers.
func TestRealKernel(t *testing.T) {
	mode, err := NewKernel().RDMANetnsMode()
	if err != nil {
		require.ErrorIs(t, err, ErrNoRDMANetlink)
	} else {
		require.Contains(t, []string{ModeExclusive, ModeShared}, mode)
	}
	_, err = NewKernel().IPv4Addrs("fastpath-no-such-link")
	require.ErrorIs(t, err, ErrNoLink)
	addrs, err := NewKernel().IPv4Addrs("lo")
	require.NoError(t, err)
	require.Contains(t, addrs, "127.0.0.1")
}
