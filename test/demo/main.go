// Command demo runs fastpath's whole flow on the bundled DGX fixture host
// (make demo, as root): it builds both binaries, starts the device plugin
// against a kubelet stand-in, allocates VFs as the kubelet would, attaches
// them to a fresh pod netns with the sriov CNI — veth links named as the
// fixture's VF netdevs stand in for the VFs — prints what the pod got, then
// detaches everything and checks that nothing is left behind.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/kubeletstub"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

const resource = "mellanox.com/mlnx_sriov_rdma"

func main() {
	host := flag.String("host-root", "testdata/sysfs/dgx-h100", "fixture host to serve")
	config := flag.String("config", "testdata/config/combined.json", "pool config")
	vfs := flag.Int("vfs", 2, "VFs the demo pod asks for")
	policy := flag.String("policy", "testdata/policy/seed.yaml", "SriovNetworkNodePolicy the first step applies to a host without VFs")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "make demo needs root: it creates a network namespace and veth links standing in for the VFs (sudo make demo)")
		os.Exit(2)
	}
	// The node's network namespace is one of the demo's own: its VF
	// stand-ins never meet the host's links, nor survive a killed demo.
	os.Exit(testnet.Own(func() int {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		d := &demo{out: os.Stdout, vfs: *vfs, policy: *policy}
		err := d.run(ctx, *host, *config)
		if cerr := d.cleanup(); err == nil {
			err = cerr
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			return 1
		}
		return 0
	}))
}

type demo struct {
	out    io.Writer
	vfs    int
	policy string
	work   string
	// logs is where the plugin's and the CNI's logs go (kept after the
	// demo): its output is the story, their lines are in the file.
	logs *os.File
	// undo runs newest first on cleanup.
	undo []func() error
}

func (d *demo) step(format string, args ...any) {
	fmt.Fprintf(d.out, "\n== "+format+"\n", args...)
}

func (d *demo) defer_(f func() error) { d.undo = append(d.undo, f) }

func (d *demo) cleanup() error {
	var errs []error
	for i := len(d.undo) - 1; i >= 0; i-- {
		if err := d.undo[i](); err != nil {
			errs = append(errs, err)
		}
	}
	d.undo = nil
	return errors.Join(errs...)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (d *demo) run(ctx context.Context, hostRoot, config string) error {
	hostRoot, err := filepath.Abs(hostRoot)
	if err != nil {
		return err
	}
	if d.work, err = os.MkdirTemp("", "fastpath-demo-"); err != nil {
		return err
	}
	d.defer_(func() error { return os.RemoveAll(d.work) })
	if d.logs, err = os.CreateTemp("", "fastpath-demo-*.log"); err != nil {
		return err
	}
	d.defer_(func() error {
		fmt.Fprintf(d.out, "\nThe device plugin's and the CNI's logs: %s\n", d.logs.Name())
		return d.logs.Close()
	})
	fmt.Fprintf(d.out, "The device plugin's and the CNI's logs go to %s; what follows is what each step did.\n", d.logs.Name())
	bin := filepath.Join(d.work, "bin")

	d.step("build")
	for _, b := range []struct{ pkg, name string }{
		{"./cmd/rdma-device-plugin", "rdma-device-plugin"},
		{"./cmd/sriov-cni", "sriov"},
		{"github.com/containernetworking/plugins/plugins/ipam/host-local", "host-local"},
	} {
		if out, err := exec.Command("go", "build", "-buildvcs=false", "-o", filepath.Join(bin, b.name), b.pkg).CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
		fmt.Fprintf(d.out, "  %s\n", filepath.Join(bin, b.name))
	}

	if err := d.provision(ctx, bin, d.policy); err != nil {
		return err
	}

	d.step("device plugin on %s, registering with a kubelet stand-in", hostRoot)
	fmt.Fprintf(d.out, "  (another host: the committed %s, whose 8 rails have 4 VFs each, 32 in all,\n"+
		"   where the copy above got the seed policy's 8 per rail, 64: from here on the demo serves it)\n", filepath.Base(hostRoot))
	kdir := filepath.Join(d.work, "device-plugins")
	devinfoDir := filepath.Join(d.work, "devinfo")
	if err := os.MkdirAll(kdir, 0o755); err != nil {
		return err
	}
	stub := kubeletstub.New(kdir)
	if err := stub.Start(); err != nil {
		return err
	}
	d.defer_(func() error { stub.Stop(); return nil })
	var dpLog bytes.Buffer
	// The fixture is both where the plugin reads (--host-root) and, on
	// this machine, where the device nodes it hands out are (--node-root).
	dp := exec.Command(filepath.Join(bin, "rdma-device-plugin"), "--host-root", hostRoot, "--node-root", hostRoot, "--config", config,
		"--kubelet-dir", kdir, "--devinfo-dir", devinfoDir, "--metrics-addr", "", "--log-level", "warn")
	dp.Stdout = io.MultiWriter(&dpLog, d.logs)
	dp.Stderr = dp.Stdout
	if err := dp.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- dp.Wait() }()
	d.defer_(func() error {
		if dp.ProcessState != nil {
			return nil
		}
		_ = dp.Process.Kill()
		<-exited
		return nil
	})
	var endpoint string
	for len(endpoint) == 0 {
		r, err := stub.WaitRegistration(15 * time.Second)
		if err != nil {
			return fmt.Errorf("%w; plugin log:\n%s", err, dpLog.String())
		}
		fmt.Fprintf(d.out, "  registered %-36s endpoint %s\n", r.Request.ResourceName, r.Request.Endpoint)
		if r.Request.ResourceName == resource {
			endpoint = r.Request.Endpoint
		}
	}
	client, conn, err := stub.Dial(endpoint)
	if err != nil {
		return err
	}
	defer conn.Close()
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := client.ListAndWatch(lctx, &pluginapi.Empty{})
	if err != nil {
		return err
	}
	list, err := stream.Recv()
	if err != nil {
		return err
	}
	var ids []string
	for _, dev := range list.Devices {
		if dev.Health == pluginapi.Healthy {
			ids = append(ids, dev.ID)
		}
	}
	fmt.Fprintf(d.out, "  %s: %d devices, %d healthy\n", resource, len(list.Devices), len(ids))

	d.step("the kubelet allocates %d VFs for the pod's container", d.vfs)
	pref, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: ids, AllocationSize: int32(d.vfs)}}})
	if err != nil {
		return err
	}
	chosen := pref.ContainerResponses[0].DeviceIDs
	fmt.Fprintf(d.out, "  preferred (policy spread: one VF per rail): %s\n", strings.Join(chosen, " "))
	alloc, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: chosen}}})
	if err != nil {
		return err
	}
	cr := alloc.ContainerResponses[0]
	fmt.Fprintln(d.out, "  container environment (NAME  value; NCCL_IB_HCA's leading = asks NCCL for exactly these HCAs, so mlx5_1 does not also match mlx5_12):")
	var keys []string
	for k := range cr.Envs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(d.out, "    %-44s %s\n", k, cr.Envs[k])
	}
	fmt.Fprintln(d.out, "  container devices:")
	for _, spec := range cr.Devices {
		fmt.Fprintf(d.out, "    %-28s %s (%s)\n", spec.ContainerPath, spec.HostPath, spec.Permissions)
	}
	var infos map[string]struct {
		Netdev string `json:"netdev"`
	}
	if err := json.Unmarshal([]byte(cr.Envs["PCIDEVICE_MELLANOX_COM_MLNX_SRIOV_RDMA_INFO"]), &infos); err != nil {
		return fmt.Errorf("PCIDEVICE_..._INFO: %w", err)
	}

	d.step("the sriov CNI attaches them to the pod's netns (veth links stand in for the VFs)")
	pod := "fastpath-demo-" + randHex(3)
	if out, err := exec.Command("ip", "netns", "add", pod).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add: %v: %s", err, out)
	}
	d.defer_(func() error { return exec.Command("ip", "netns", "del", pod).Run() })
	podPath := "/var/run/netns/" + pod
	for _, id := range chosen {
		name := infos[id].Netdev
		peer := "fpdemo" + randHex(3)
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
			return fmt.Errorf("stand-in %s for VF %s: %w", name, id, err)
		}
		d.defer_(func() error {
			if l, err := netlink.LinkByName(peer); err == nil {
				return netlink.LinkDel(l)
			}
			return nil
		})
		l, _ := netlink.LinkByName(name)
		fmt.Fprintf(d.out, "  stand-in for VF %s: %s (MAC %s)\n", id, name, l.Attrs().HardwareAddr)
	}
	// The CNI's paths are the node's (its node config, root's, named in
	// FASTPATH_CNI_NODE_CONFIG), not the network's; no kubelet answers
	// PodResources here, so deviceID is trusted.
	stateDir, nodeConf := filepath.Join(d.work, "cni-state"), filepath.Join(d.work, "cni-node.json")
	if err := os.WriteFile(nodeConf, []byte(fmt.Sprintf(`{"stateDir":%q,"deviceInfoDir":%q,"draSocket":"","deviceIDCheck":"off"}`,
		stateDir, devinfoDir)), 0o644); err != nil {
		return err
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"sriov-rdma","plugins":[{"type":"sriov","capabilities":{"deviceID":true},`+
		`"logLevel":"warn","ipam":{"type":"host-local","ranges":[[{"subnet":"192.168.100.0/24"}]],"dataDir":%q}}]}`,
		filepath.Join(d.work, "ipam"))
	netList, err := libcni.ConfListFromBytes([]byte(conf))
	if err != nil {
		return err
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{bin}, filepath.Join(d.work, "cni-cache"),
		&invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: d.logs}, PluginDecoder: version.PluginDecoder{}})
	os.Setenv("FASTPATH_HOST_ROOT", hostRoot) // the CNI reads the fixture's sysfs
	os.Setenv("FASTPATH_CNI_NODE_CONFIG", nodeConf)
	rts := make([]*libcni.RuntimeConf, len(chosen))
	for i, id := range chosen {
		// As Multus does: the VF the device plugin allocated, as deviceID.
		rts[i] = &libcni.RuntimeConf{ContainerID: "demo-pod", NetNS: podPath, IfName: fmt.Sprintf("net%d", i+1),
			CapabilityArgs: map[string]any{"deviceID": id}}
		res, err := cni.AddNetworkList(ctx, netList, rts[i])
		if err != nil {
			return err
		}
		r, err := current.NewResultFromResult(res)
		if err != nil {
			return err
		}
		fmt.Fprintf(d.out, "  ADD %s -> %s %s\n", id, r.Interfaces[0].Name, r.IPs[0].Address.String())
	}
	fmt.Fprintf(d.out, "  (the fixture's RDMA devices are not this kernel's: the CNI leaves them in the host netns and says so in %s)\n", d.logs.Name())
	fmt.Fprintln(d.out, "  the pod's netns:")
	if err := d.showPod(podPath); err != nil {
		return err
	}

	d.step("the pod is deleted: DEL, then the device plugin stops")
	for i := len(rts) - 1; i >= 0; i-- {
		if err := cni.DelNetworkList(ctx, netList, rts[i]); err != nil {
			return err
		}
		fmt.Fprintf(d.out, "  DEL %s\n", rts[i].IfName)
	}
	if err := dp.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	if err := <-exited; err != nil {
		return fmt.Errorf("device plugin exit: %v; log:\n%s", err, dpLog.String())
	}
	if err := d.checkClean(chosen, infos, stateDir, devinfoDir, kdir); err != nil {
		return err
	}
	return d.doctor(ctx, stub, bin, kdir, config)
}

func (d *demo) showPod(path string) error {
	n, err := netns.Open(path)
	if err != nil {
		return err
	}
	defer n.Close()
	links, err := n.Handle().LinkList()
	if err != nil {
		return err
	}
	for _, l := range links {
		a := l.Attrs()
		addrs, _ := n.Handle().AddrList(l, netlink.FAMILY_V4)
		var as []string
		for _, x := range addrs {
			as = append(as, x.IPNet.String())
		}
		fmt.Fprintf(d.out, "    %-6s %-17s mtu %-5d alias %-12q %s\n", a.Name, a.HardwareAddr, a.MTU, a.Alias, strings.Join(as, " "))
	}
	return nil
}

// checkClean verifies that every stand-in is back under its own name and
// that no state, device-info file or socket is left.
func (d *demo) checkClean(ids []string, infos map[string]struct {
	Netdev string `json:"netdev"`
}, dirs ...string) error {
	d.step("nothing left behind")
	for _, id := range ids {
		name := infos[id].Netdev
		if _, err := netlink.LinkByName(name); err != nil {
			return fmt.Errorf("stand-in %s not back on the host: %w", name, err)
		}
		fmt.Fprintf(d.out, "  %s is back on the host under its own name\n", name)
	}
	for _, dir := range dirs {
		ents, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		var left []string
		for _, e := range ents {
			if e.Name() != "kubelet.sock" {
				left = append(left, e.Name())
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("%s still holds %s", dir, strings.Join(left, ", "))
		}
		fmt.Fprintf(d.out, "  %s: empty\n", dir)
	}
	return nil
}
