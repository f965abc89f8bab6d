package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
)

func TestIfList(t *testing.T) {
	for _, tc := range []struct {
		list string
		name string
		port int
		want bool
	}{
		{"", "mlx5_12", 1, true},
		{"mlx5_1", "mlx5_12", 1, true}, // a prefix
		{"=mlx5_1", "mlx5_12", 1, false},
		{"=mlx5_12:1,mlx5_16:1", "mlx5_12", 1, true},
		{"=mlx5_12:2", "mlx5_12", 1, false},
		{"mlx5_12:1:0:3", "mlx5_12", 1, true}, // NCCL reads the port with atoi
		{"^mlx5_0", "mlx5_0", 1, false},
		{"^mlx5_0", "mlx5_01", 1, false},
		{"^=mlx5_0", "mlx5_01", 1, true},
		{"^=mlx5_0", "mlx5_0", 1, false},
		{"eth", "eth0", -1, true},
		{"=eth0", "eth01", -1, false},
		{"^docker,lo", "net1", -1, true},
	} {
		require.Equal(t, tc.want, parseIfList(tc.list).selects(tc.name, tc.port), "%q selects %s:%d", tc.list, tc.name, tc.port)
	}
	require.Equal(t, []string{"ib0"}, socketDefault([]string{"lo", "eth0", "ib0", "docker0"}))
	require.Equal(t, []string{"eth0", "net1"}, socketDefault([]string{"lo", "eth0", "docker0", "net1"}))
	for v, want := range map[string]bool{"1": true, "0": false, "": false, "yes": false, " 2 ": true} {
		require.Equal(t, want, ncclEnvTrue(v), v)
	}
}

// fakePod is a container's /proc/PID, the way the kernel shows it.
type fakePod struct {
	env     map[string]string
	devices []string          // /dev/infiniband nodes it has (as on the host)
	ifs     map[string]string // interface -> PCI address ("" for none)
}

const podPID = 4242

// write makes ProcRoot/4242 for a pod on the host at root.
func (p fakePod) write(t *testing.T, hostRoot string) string {
	t.Helper()
	proc := t.TempDir()
	dir := filepath.Join(proc, strconv.Itoa(podPID))
	var env []string
	for k, v := range p.env {
		env = append(env, k+"="+v)
	}
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "net"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "environ"), []byte(strings.Join(env, "\x00")+"\x00"), 0o400))
	dev := "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes\n"
	for n, addr := range p.ifs {
		dev += "  " + n + ": 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
		if addr != "" {
			link := filepath.Join(dir, "root/sys/class/net", n, "device")
			require.NoError(t, os.MkdirAll(filepath.Dir(link), 0o755))
			require.NoError(t, os.Symlink("../../../"+addr, link))
		}
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "net/dev"), []byte(dev), 0o444))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "root/dev/infiniband"), 0o755))
	for _, d := range p.devices {
		// The runtime makes the node with the host's major:minor.
		var st struct{ major, minor uint32 }
		class := "infiniband_verbs"
		if d == "rdma_cm" {
			class = "misc"
		} else if !strings.HasPrefix(d, "uverbs") {
			class = "infiniband_mad"
		}
		b, err := os.ReadFile(filepath.Join(hostRoot, "sys/class", class, d, "dev"))
		require.NoError(t, err)
		_, err = fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &st.major, &st.minor)
		require.NoError(t, err)
		require.NoError(t, fixture.Mknod(filepath.Join(dir, "root"), d, st.major, st.minor))
	}
	return proc
}

func TestPod(t *testing.T) {
	// generate: VF 0000:10:00.1 is mlx5_1 (uverbs1), 0000:11:00.1 mlx5_4.
	root := newHost(t, "generate")
	info := `{"0000:10:00.1":{"pciAddress":"0000:10:00.1","rdmaDevice":"mlx5_1","linkType":"InfiniBand","numaNode":0}}`
	base := map[string]string{"PCIDEVICE_MELLANOX_COM_RAILS": "0000:10:00.1", "PCIDEVICE_MELLANOX_COM_RAILS_INFO": info,
		"NCCL_IB_HCA": "=mlx5_1:1", "UCX_NET_DEVICES": "mlx5_1:1", "PATH": "/usr/bin"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	run := func(p fakePod) *Report {
		return Run(Options{HostRoot: root, Config: config(t, genConfig), PodPID: podPID, ProcRoot: p.write(t, root)})
	}
	good := fakePod{env: base, devices: []string{"uverbs1", "umad1", "issm1", "rdma_cm"}, ifs: map[string]string{"lo": "", "eth0": "", "net1": "0000:10:00.1"}}

	t.Run("no process", func(t *testing.T) {
		r := Run(Options{HostRoot: root, PodPID: 99999, ProcRoot: t.TempDir()})
		requireCheck(t, r, "pod", Fail, "pid 99999", "cannot read", "crictl inspect")
	})
	t.Run("no devices", func(t *testing.T) {
		requireCheck(t, run(fakePod{env: base, ifs: good.ifs}), "pod", Fail, "no usable /dev/infiniband/uverbs", "resources.limits")
	})
	if os.Geteuid() != 0 {
		t.Skip("the container's char devices need mknod: run as root (CI does)")
	}
	t.Run("as the plugin set it", func(t *testing.T) {
		r := run(good)
		requireCheck(t, r, "pod", OK, "can open mlx5_1 and rdma_cm")
		requireCheck(t, r, "nccl-env", OK, "NCCL_IB_HCA==mlx5_1:1 selects exactly")
		requireCheck(t, r, "pod", OK, "mlx5_1 (0000:10:00.1) is the pod's net1")
		requireNo(t, r, "nccl-env", Fail)
		requireNo(t, r, "nccl-env", Warn)
	})
	t.Run("the pod spec's own NCCL_IB_HCA wins (issue 12)", func(t *testing.T) {
		p := good
		p.env = with("NCCL_IB_HCA", "mlx5_0")
		requireCheck(t, run(p), "nccl-env", Fail, "NCCL_IB_HCA=mlx5_0 selects none", "mlx5_1",
			"not the device plugin's value (=mlx5_1:1)", "kubelet keeps the pod spec's value", "remove NCCL_IB_HCA from the pod spec")
	})
	t.Run("a prefix that matches more than it names", func(t *testing.T) {
		p := good
		p.env = with("NCCL_IB_HCA", "mlx5")
		requireCheck(t, run(p), "nccl-env", Warn, "mlx5 is a prefix")
	})
	t.Run("a rail left out", func(t *testing.T) {
		p := good
		p.devices = []string{"uverbs1", "uverbs4", "rdma_cm"}
		p.env = with("NCCL_IB_HCA", "=mlx5_1:1,mlx5_7:1")
		r := run(p)
		requireCheck(t, r, "nccl-env", Warn, "mlx5_7 is not in the container", "leaves out mlx5_4")
	})
	t.Run("settings that force sockets", func(t *testing.T) {
		p := good
		p.env = with("NCCL_IB_DISABLE", "1", "NCCL_NET", "Socket", "NCCL_SOCKET_IFNAME", "=ib0")
		r := run(p)
		requireCheck(t, r, "nccl-env", Fail, "NCCL_IB_DISABLE=1")
		requireCheck(t, r, "nccl-env", Fail, "NCCL_NET=Socket")
		requireCheck(t, r, "nccl-env", Fail, "NCCL_SOCKET_IFNAME==ib0 matches none", "eth0", "No IP interface found")
	})
	t.Run("UCX_NET_DEVICES naming another device", func(t *testing.T) {
		p := good
		p.env = with("UCX_NET_DEVICES", "mlx5_0:1,eth0")
		requireCheck(t, run(p), "nccl-env", Warn, "UCX_NET_DEVICES=mlx5_0:1,eth0", "names mlx5_0:1")
	})
	t.Run("VF netdev not attached", func(t *testing.T) {
		p := good
		p.ifs = map[string]string{"lo": "", "eth0": ""}
		requireCheck(t, run(p), "pod", Warn, "mlx5_1's VF 0000:10:00.1 has no netdev", "k8s.v1.cni.cncf.io/networks")
	})
	t.Run("a stale device node", func(t *testing.T) {
		p := good
		proc := p.write(t, root)
		require.NoError(t, fixture.Mknod(filepath.Join(proc, strconv.Itoa(podPID), "root"), "uverbs1", 231, 200))
		r := Run(Options{HostRoot: root, Config: config(t, genConfig), PodPID: podPID, ProcRoot: proc})
		requireCheck(t, r, "pod", Fail, "uverbs1 is 231:200, sysfs says 231:193", "recreate the pod")
	})
}

func TestPodRoCE(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the container's char devices need mknod: run as root (CI does)")
	}
	// roce-cx6dx: VF 0000:3b:00.2 is mlx5_2 (uverbs2), ens1f0v0, with
	// 192.168.1.20: v1 GID at 2, v2 at 3.
	root := newHost(t, "roce-cx6dx")
	env := map[string]string{"NCCL_IB_HCA": "=mlx5_2:1"}
	run := func(p fakePod) *Report {
		return Run(Options{HostRoot: root, Config: config(t, roceConfig), PodPID: podPID, ProcRoot: p.write(t, root)})
	}
	p := fakePod{env: env, devices: []string{"uverbs2", "rdma_cm"}, ifs: map[string]string{"lo": "", "eth0": ""}}
	requireCheck(t, run(p), "pod", Fail, "mlx5_2's VF 0000:3b:00.2 has no netdev", "routable GID")

	p.ifs = map[string]string{"lo": "", "eth0": "", "net1": "0000:3b:00.2"}
	p.env = map[string]string{"NCCL_IB_HCA": "=mlx5_2:1", "NCCL_IB_GID_INDEX": "2"}
	requireCheck(t, run(p), "nccl-env", Fail, "NCCL_IB_GID_INDEX=2 is IB/RoCE v1 192.168.1.20", "unset NCCL_IB_GID_INDEX")
	p.env["NCCL_IB_GID_INDEX"] = "3"
	requireCheck(t, run(p), "nccl-env", Warn, "NCCL_IB_GID_INDEX=3 is pinned", "RoCE v2 192.168.1.20")
	p.env["NCCL_IB_GID_INDEX"] = "9"
	requireCheck(t, run(p), "nccl-env", Fail, "GID 9 of mlx5_2 is empty")
}
