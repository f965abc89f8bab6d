package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
)

// checkpointFile is where the kubelet's device manager keeps what it knows
// of device plugins: the healthy devices of each registered resource and
// which pod holds which device.
const checkpointFile = "kubelet_internal_checkpoint"

// checkpoint is the part of the kubelet's device manager checkpoint
// doctor reads.
type checkpoint struct {
	Data struct {
		PodDeviceEntries []struct {
			PodUID        string
			ContainerName string
			ResourceName  string
			// DeviceIDs is a map of NUMA node to IDs (kubelet >= 1.20) or,
			// in older checkpoints, a list.
			DeviceIDs json.RawMessage
		}
		RegisteredDevices map[string][]string
	}
}

// ids returns a pod entry's device IDs in either checkpoint format.
func ids(raw json.RawMessage) []string {
	var perNUMA map[string][]string
	if json.Unmarshal(raw, &perNUMA) == nil {
		var out []string
		for _, v := range perNUMA {
			out = append(out, v...)
		}
		return out
	}
	var flat []string
	_ = json.Unmarshal(raw, &flat)
	return flat
}

// readCheckpoint loads the kubelet's checkpoint, when there is one, into
// h.cp and h.allocated.
func (h *host) readCheckpoint() {
	h.allocated = map[string]string{}
	if h.opts.KubeletDir == "" {
		return
	}
	b, err := os.ReadFile(filepath.Join(h.opts.KubeletDir, checkpointFile))
	if err != nil {
		h.denied("kubelet", checkpointFile, err)
		return
	}
	var cp checkpoint
	if json.Unmarshal(b, &cp) != nil {
		return
	}
	h.cp = &cp
	for _, e := range cp.Data.PodDeviceEntries {
		for _, id := range ids(e.DeviceIDs) {
			h.allocated[id] = e.ResourceName
		}
	}
}

// dialSocket says whether something accepts connections on a unix socket.
func dialSocket(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("%s is not a socket", path)
	}
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// askPlugin calls GetDevicePluginOptions on a pool's socket: the plugin
// answers, not just a file left behind.
func askPlugin(path string) error {
	if err := dialSocket(path); err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	return err
}

func (h *host) checkKubelet() {
	const name = "kubelet"
	dir := h.opts.KubeletDir
	if dir == "" {
		return
	}
	if _, err := os.Stat(dir); err != nil {
		if h.denied(name, dir, err) {
			return
		}
		h.addf(name, Fail, dir, "find the kubelet's --root-dir (ps -o args -C kubelet) and pass its device-plugins directory with --kubelet-dir; set the DaemonSet's hostPath and --kubelet-dir to it too",
			"%v: the kubelet keeps its device-plugins directory elsewhere (k0s, microk8s and some distributions move --root-dir), or it is not mounted here", err)
		return
	}
	sock := filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket))
	switch err := dialSocket(sock); {
	case h.denied(name, sock, err):
	case errors.Is(err, fs.ErrNotExist):
		h.add(name, Fail, sock, sock+" does not exist: the kubelet is not running, or this is not its device-plugins directory", "systemctl status kubelet; journalctl -u kubelet")
	case err != nil:
		h.addf(name, Fail, sock, "systemctl status kubelet; journalctl -u kubelet", "%v: the kubelet is not running, so nothing registers and no pod gets a device", err)
	default:
		h.add(name, OK, sock, "the kubelet answers", "")
	}
	if h.opts.Config == nil {
		return
	}
	for _, p := range h.pools {
		r := p.ResourceName()
		ps := filepath.Join(dir, plugin.SocketName(p.Prefix, p.Name))
		err := askPlugin(ps)
		if h.denied(name, r, err) {
			continue
		}
		if err != nil {
			msg := fmt.Sprintf("the plugin does not answer on %s: %v", ps, err)
			if errors.Is(err, fs.ErrNotExist) {
				msg = ps + " does not exist: the plugin is not running, or not serving this pool"
			}
			h.add(name, Fail, r, msg, "kubectl -n fastpath get pods -o wide; kubectl -n fastpath logs ds/rdma-device-plugin")
			continue
		}
		switch devs, ok := h.registered(r); {
		case h.cp == nil:
			h.addf(name, OK, r, "", "the plugin answers on %s (no %s here to tell whether the kubelet registered it: kubectl get node <node> -o jsonpath='{.status.allocatable}' does)", filepath.Base(ps), checkpointFile)
		case !ok:
			h.addf(name, Warn, r, "the kubelet's log says why it refused or did not dial the plugin: journalctl -u kubelet | grep -i "+r,
				"the plugin answers on %s but the kubelet's checkpoint does not list %s: not registered (yet)", filepath.Base(ps), r)
		case len(devs) == 0 && len(p.Devices) > 0:
			h.addf(name, Warn, r, "check the plugin's log for unhealthy devices (links down, VFs gone)",
				"registered, but the kubelet holds no healthy device of it (%s in the pool)", plural(len(p.Devices), "device", "devices"))
		default:
			held := 0
			for _, id := range devs {
				if h.allocated[id] == r {
					held++
				}
			}
			if held == len(devs) {
				h.addf(name, Warn, r, "wait for pods to end, free devices (kubectl get pods -A -o wide on this node), or add VFs",
					"every one of its %s is held by a pod: a new pod asking for %s stays Pending (Insufficient %s)", plural(len(devs), "healthy device", "healthy devices"), r, r)
				continue
			}
			h.addf(name, OK, r, "", "registered: %s healthy at the kubelet's last checkpoint, %d held by pods", plural(len(devs), "device", "devices"), held)
		}
	}
}

// registered returns the healthy devices the kubelet's checkpoint lists
// for a resource.
func (h *host) registered(resource string) ([]string, bool) {
	if h.cp == nil {
		return nil, false
	}
	devs, ok := h.cp.Data.RegisteredDevices[resource]
	return slices.Clip(devs), ok
}
