package dra

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/fastpath-k8s/fastpath/internal/ifname"
	"github.com/fastpath-k8s/fastpath/internal/netdata"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
)

// The VF's interface in the pod (KEP-5304's networkData: its name there,
// MAC and addresses) exists only once the CNI's ADD is through, after
// Prepare. The kubelet runs the pod's network (its sandbox) after it
// prepared the claims and before it creates the containers, whose CDI
// edits bind-mount the metadata file; so the sriov CNI, once its ADD of a
// VF the driver prepared succeeded, tells the driver on a unix socket of
// its own in the plugin directory (internal/netdata), and waits: the
// driver finds the claim and request holding the VF, checks that the
// claim is the pod's, keeps the data in its checkpoint (a Prepare
// answered from it after a restart rewrites the same file) and has the
// helper rewrite the request's metadata file (Helper.UpdateRequestMetadata,
// which bumps its generation) before it answers.

// NetDataSocket is the socket the CNI posts to, in a plugin directory.
func NetDataSocket(pluginDir string) string { return filepath.Join(pluginDir, netdata.SocketName) }

// netDataTimeout bounds a request: the CNI waits about 2 s.
const netDataTimeout = 5 * time.Second

// startNetData listens on the socket (a stale one of a killed run
// replaced), readable by root only. A socket that cannot be made is
// logged: the CNI then warns that the pods' metadata lacks their
// interfaces, and the rest of the driver works.
func (d *Driver) startNetData() {
	path := NetDataSocket(d.opts.PluginDir)
	if err := removeFile(path); err != nil {
		d.log.Error("dra: network data socket not served: the pods' device metadata will lack their interfaces", "err", err)
		return
	}
	ln, err := net.Listen("unix", path)
	if err == nil {
		if err = os.Chmod(path, 0o600); err != nil {
			ln.Close()
		}
	}
	if err != nil {
		d.log.Error("dra: network data socket not served: the pods' device metadata will lack their interfaces", "socket", path, "err", err)
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc(netdata.Path, d.serveNetData)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: netDataTimeout, ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)}
	d.mu.Lock()
	d.netSrv = srv
	d.mu.Unlock()
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("dra: network data socket", "socket", path, "err", err)
		}
	}()
}

// stopNetData closes the socket and removes it.
func (d *Driver) stopNetData() {
	d.mu.Lock()
	srv := d.netSrv
	d.netSrv = nil
	d.mu.Unlock()
	if srv == nil {
		return
	}
	_ = srv.Close()
	if err := removeFile(NetDataSocket(d.opts.PluginDir)); err != nil {
		d.log.Warn("dra: network data socket left", "err", err)
	}
}

func (d *Driver) serveNetData(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST a network data request to "+netdata.Path, http.StatusMethodNotAllowed)
		return
	}
	var req netdata.Request
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		http.Error(w, "network data request: "+err.Error(), http.StatusBadRequest)
		return
	}
	nd, err := checkNetData(req)
	if err != nil {
		http.Error(w, fmt.Sprintf("network data of VF %s: %v", req.PCIAddress, err), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), netDataTimeout)
	defer cancel()
	resp, code, err := d.publishNetData(ctx, req, nd)
	if err != nil {
		d.log.Warn("dra: network data refused", "vf", req.PCIAddress, "pod", req.PodNamespace+"/"+req.PodName, "err", err)
		http.Error(w, err.Error(), code)
		return
	}
	d.log.Info("dra: network data published", "vf", req.PCIAddress, "pod", req.PodNamespace+"/"+req.PodName,
		"claim", resp.Claim, "request", resp.Request, "interface", nd.InterfaceName, "ips", nd.IPs)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// checkNetData checks a request and returns its network data as the
// metadata API takes it (its limits: 16 unique addresses in CIDR form).
func checkNetData(req netdata.Request) (*resourceapi.NetworkDeviceData, error) {
	switch {
	case !pci.ValidAddress(req.PCIAddress):
		return nil, fmt.Errorf("pciAddress %q is not a PCI address (want DDDD:BB:DD.F)", req.PCIAddress)
	case req.PodNamespace == "" || req.PodName == "" || req.PodUID == "":
		return nil, errors.New("podNamespace, podName and podUID must be set (the runtime's K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_UID)")
	case len(req.IPs) > 16:
		return nil, fmt.Errorf("%d ips: the metadata takes at most 16", len(req.IPs))
	}
	if err := ifname.Check(req.InterfaceName); err != nil {
		return nil, fmt.Errorf("interfaceName: %w", err)
	}
	if req.HardwareAddress != "" {
		if _, err := net.ParseMAC(req.HardwareAddress); err != nil {
			return nil, fmt.Errorf("hardwareAddress: %w", err)
		}
	}
	for i, ip := range req.IPs {
		if _, err := netip.ParsePrefix(ip); err != nil {
			return nil, fmt.Errorf("ips[%d] %q: want an address in CIDR form (10.0.0.5/24): %w", i, ip, err)
		}
		if slices.Contains(req.IPs[:i], ip) {
			return nil, fmt.Errorf("ips[%d] %q given twice", i, ip)
		}
	}
	return &resourceapi.NetworkDeviceData{InterfaceName: req.InterfaceName, HardwareAddress: req.HardwareAddress, IPs: slices.Clone(req.IPs)}, nil
}

// publishNetData records the VF's network data for the pod's claim that
// holds it and rewrites the metadata file of the claim's request. The
// status code says why it was refused.
func (d *Driver) publishNetData(ctx context.Context, req netdata.Request, nd *resourceapi.NetworkDeviceData) (*netdata.Response, int, error) {
	pod := types.UID(req.PodUID)
	podName := req.PodNamespace + "/" + req.PodName + " (" + req.PodUID + ")"
	d.mu.Lock()
	holders := d.holdersLocked(req.PCIAddress)
	uid := reservedHolder(holders, req.PodNamespace, pod)
	d.mu.Unlock()
	if len(holders) == 0 {
		return nil, http.StatusNotFound, fmt.Errorf("no claim prepared on node %s holds VF %s (a VF of the device plugin, or of a claim already unprepared, has no DRA device metadata)", d.opts.NodeName, req.PCIAddress)
	}
	if uid == "" {
		// Reserved for the pod after Prepare (a shared claim the pod
		// joined): the API server knows.
		uid = d.reservedNow(ctx, holders, req.PodNamespace, pod)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if uid == "" {
		var names []string
		for _, h := range holders {
			names = append(names, fmt.Sprintf("%s/%s (%s)", h.rec.Namespace, h.rec.Name, h.uid))
		}
		return nil, http.StatusForbidden, fmt.Errorf("VF %s is prepared for claim %v, which is not reserved for pod %s", req.PCIAddress, names, podName)
	}
	rec := d.cp.Claims[uid]
	if rec == nil {
		return nil, http.StatusNotFound, fmt.Errorf("the claim (%s) of VF %s was unprepared meanwhile", uid, req.PCIAddress)
	}
	if d.helper == nil {
		return nil, http.StatusServiceUnavailable, errors.New("the driver is stopping")
	}
	if !slices.Contains(rec.Pods, pod) {
		rec.Pods = append(rec.Pods, pod)
	}
	old := make([]*resourceapi.NetworkDeviceData, len(rec.Devices))
	var requests []string
	for i := range rec.Devices {
		pd := &rec.Devices[i]
		old[i] = pd.NetworkData
		if pd.PCIAddress == req.PCIAddress {
			pd.NetworkData = nd
			if !slices.Contains(requests, pd.Request) {
				requests = append(requests, pd.Request)
			}
		}
	}
	undo := func(err error) error {
		for i := range rec.Devices {
			rec.Devices[i].NetworkData = old[i]
		}
		if serr := d.cp.save(d.cpPath); serr != nil {
			err = errors.Join(err, serr)
		}
		return err
	}
	if err := d.cp.save(d.cpPath); err != nil {
		return nil, http.StatusInternalServerError, undo(err)
	}
	for _, r := range requests {
		var devs []kubeletplugin.Device
		for _, pd := range rec.Devices {
			if pd.Request == r {
				devs = append(devs, metadataDevice(pd))
			}
		}
		if err := d.helper.UpdateRequestMetadata(ctx, rec.Namespace, rec.Name, uid, r, devs); err != nil {
			return nil, http.StatusInternalServerError, undo(fmt.Errorf("claim %s/%s request %s: device metadata: %w", rec.Namespace, rec.Name, r, err))
		}
	}
	d.writeClaimStatus(uid)
	return &netdata.Response{Claim: rec.Namespace + "/" + rec.Name, Request: requests[0]}, http.StatusOK, nil
}

// holder is a prepared claim that holds a VF.
type holder struct {
	uid types.UID
	rec *preparedClaim
}

// holdersLocked are the prepared claims that hold the VF at a PCI
// address (one, and claims with admin access to it), by UID.
func (d *Driver) holdersLocked(pciAddress string) []holder {
	var out []holder
	for uid, c := range d.cp.Claims {
		if slices.ContainsFunc(c.Devices, func(pd preparedDevice) bool { return pd.PCIAddress == pciAddress }) {
			out = append(out, holder{uid, c})
		}
	}
	slices.SortFunc(out, func(a, b holder) int {
		if a.rec.admin() != b.rec.admin() {
			if a.rec.admin() {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.uid, b.uid)
	})
	return out
}

// admin reports whether the claim has admin access to its VFs.
func (c *preparedClaim) admin() bool {
	return slices.ContainsFunc(c.Devices, func(pd preparedDevice) bool { return pd.AdminAccess })
}

// reservedHolder is the first holder in the pod's namespace that was
// reserved for the pod at Prepare, or "".
func reservedHolder(holders []holder, ns string, pod types.UID) types.UID {
	for _, h := range holders {
		if h.rec.Namespace == ns && slices.Contains(h.rec.Pods, pod) {
			return h.uid
		}
	}
	return ""
}

// reservedNow is the first holder in the pod's namespace that the API
// server has reserved for the pod, or "".
func (d *Driver) reservedNow(ctx context.Context, holders []holder, ns string, pod types.UID) types.UID {
	for _, h := range holders {
		if h.rec.Namespace != ns {
			continue
		}
		c, err := d.opts.KubeClient.ResourceV1().ResourceClaims(ns).Get(ctx, h.rec.Name, metav1.GetOptions{})
		if err != nil {
			d.log.Warn("dra: claim not read to check its consumers", "claim", ns+"/"+h.rec.Name, "err", err)
			continue
		}
		if c.UID == h.uid && slices.Contains(reservedPods(c), pod) {
			return h.uid
		}
	}
	return ""
}

// reservedPods are the pods a claim is reserved for.
func reservedPods(c *resourceapi.ResourceClaim) []types.UID {
	var out []types.UID
	for _, r := range c.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" {
			out = append(out, r.UID)
		}
	}
	return out
}

// networkData is the network data a prepared claim has for the VF at a
// PCI address in a request; nil for a nil claim.
func (c *preparedClaim) networkData(request, pciAddress string) *resourceapi.NetworkDeviceData {
	if c == nil {
		return nil
	}
	for _, pd := range c.Devices {
		if pd.Request == request && pd.PCIAddress == pciAddress {
			return pd.NetworkData
		}
	}
	return nil
}

// metadataDevice is a prepared device as the helper is told of it.
func metadataDevice(pd preparedDevice) kubeletplugin.Device {
	return withMetadata(kubeletplugin.Device{Requests: []string{pd.Request}, PoolName: pd.Pool, DeviceName: pd.Device, CDIDeviceIDs: []string{pd.CDIDeviceID}},
		pd.Metadata, pd.NetworkData)
}
