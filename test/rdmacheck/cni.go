package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

// hostRootEnv is the sriov CNI's sysfs root (plugin.HostRootEnv);
// nodeConfigEnv names its node config (plugin.NodeConfigEnv).
const (
	hostRootEnv   = "FASTPATH_HOST_ROOT"
	nodeConfigEnv = "FASTPATH_CNI_NODE_CONFIG"
)

// cniNet is the sriov CNI with the reference host-local IPAM, driven
// through libcni as a runtime drives it (the demo's way).
type cniNet struct {
	cni      *libcni.CNIConfig
	list     *libcni.NetworkConfigList
	stateDir string
	ipamDir  string
	stderr   bytes.Buffer // the plugins' log
}

// newCNI writes the CNI's node config, work/cni-node.json (its state
// dir below work, its device-info dir too, no DRA driver, deviceID
// trusted: no kubelet answers PodResources); the plugins make their
// directories below work. The CNI reads sysfs under host and its node
// config from the environment (FASTPATH_HOST_ROOT,
// FASTPATH_CNI_NODE_CONFIG, as a runtime passes its own on): the check's
// process environment, which libcni hands the plugins.
func newCNI(bin, work, host, name, subnet string) (*cniNet, error) {
	n := &cniNet{stateDir: filepath.Join(work, "cni-state"), ipamDir: filepath.Join(work, "ipam")}
	node := filepath.Join(work, "cni-node.json")
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(node, []byte(fmt.Sprintf(`{"stateDir":%q,"deviceInfoDir":%q,"draSocket":"","deviceIDCheck":"off"}`,
		n.stateDir, filepath.Join(work, "devinfo"))), 0o644); err != nil {
		return nil, fmt.Errorf("CNI node config: %w", err)
	}
	if err := os.Setenv(hostRootEnv, host); err != nil {
		return nil, err
	}
	if err := os.Setenv(nodeConfigEnv, node); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"sriov","capabilities":{"deviceID":true},`+
		`"logLevel":"info","ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"dataDir":%q}}]}`,
		name, subnet, n.ipamDir)
	list, err := libcni.ConfListFromBytes([]byte(conf))
	if err != nil {
		return nil, fmt.Errorf("CNI conf %s: %w", name, err)
	}
	n.list = list
	n.cni = libcni.NewCNIConfigWithCacheDir([]string{bin}, filepath.Join(work, "cni-cache"),
		&invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: &n.stderr}, PluginDecoder: version.PluginDecoder{}})
	return n, nil
}

// attachment is one VF attached to a pod, as Multus asks for it.
func attachment(pod, podPath, ifName, vf string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: pod, NetNS: podPath, IfName: ifName,
		CapabilityArgs: map[string]any{"deviceID": vf}}
}

func (n *cniNet) add(ctx context.Context, rt *libcni.RuntimeConf) (*current.Result, error) {
	res, err := n.cni.AddNetworkList(ctx, n.list, rt)
	if err != nil {
		return nil, fmt.Errorf("CNI ADD %s %s: %w", rt.IfName, rt.CapabilityArgs["deviceID"], err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("CNI ADD %s: result: %w", rt.IfName, err)
	}
	if len(r.IPs) == 0 {
		return nil, fmt.Errorf("CNI ADD %s: the result has no address", rt.IfName)
	}
	return r, nil
}

func (n *cniNet) check(ctx context.Context, rt *libcni.RuntimeConf) error {
	if err := n.cni.CheckNetworkList(ctx, n.list, rt); err != nil {
		return fmt.Errorf("CNI CHECK %s: %w", rt.IfName, err)
	}
	return nil
}

func (n *cniNet) del(ctx context.Context, rt *libcni.RuntimeConf) error {
	if err := n.cni.DelNetworkList(ctx, n.list, rt); err != nil {
		return fmt.Errorf("CNI DEL %s: %w", rt.IfName, err)
	}
	return nil
}

// log is the plugins' stderr so far, indented, for a failure's report.
func (n *cniNet) log() string {
	s := strings.TrimSpace(n.stderr.String())
	if s == "" {
		return "(the plugins logged nothing)"
	}
	return "plugin log:\n           " + strings.ReplaceAll(s, "\n", "\n           ")
}

// leftovers is what the attachments left behind once every one is gone:
// the stand-ins not back in node under their own names (with their
// aliases cleared), links in the pods' netns, the CNI's state files and
// temporary netns pins, addresses host-local still holds.
func (n *cniNet) leftovers(node *netlink.Handle, netdevs, pods []string) []string {
	var left []string
	for _, name := range netdevs {
		l, err := node.LinkByName(name)
		switch {
		case err != nil:
			left = append(left, fmt.Sprintf("stand-in %s not back in the node's netns under its own name: %v", name, err))
		case l.Attrs().Alias != "":
			left = append(left, fmt.Sprintf("stand-in %s still has the alias %q", name, l.Attrs().Alias))
		}
	}
	for _, p := range pods {
		if links, err := podLinks(p); err != nil {
			left = append(left, err.Error())
		} else if len(links) > 0 {
			left = append(left, fmt.Sprintf("pod netns %s still holds %s", p, strings.Join(links, ", ")))
		}
	}
	if ents, err := os.ReadDir(n.stateDir); err == nil && len(ents) > 0 {
		var names []string
		for _, e := range ents {
			// A DEL that found no attachment leaves a tombstone, for an
			// ADD yet to start (docs/cni.md); GC or age removes it.
			if ok, _ := filepath.Match("deleted-*.json", e.Name()); !ok {
				names = append(names, e.Name())
			}
		}
		if len(names) > 0 {
			left = append(left, fmt.Sprintf("CNI state dir %s still holds %s", n.stateDir, strings.Join(names, ", ")))
		}
	}
	_ = filepath.WalkDir(n.ipamDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && net.ParseIP(d.Name()) != nil {
			left = append(left, "host-local still holds "+d.Name())
		}
		return nil
	})
	return left
}

// podLinks are the links in the netns at path other than loopback.
func podLinks(path string) ([]string, error) {
	pod, err := netns.Open(path)
	if err != nil {
		return nil, fmt.Errorf("pod netns %s: %w", path, err)
	}
	defer pod.Close()
	links, err := pod.Handle().LinkList()
	if err != nil {
		return nil, fmt.Errorf("pod netns %s: list links: %w", path, err)
	}
	var out []string
	for _, l := range links {
		if l.Attrs().Name != "lo" {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}
