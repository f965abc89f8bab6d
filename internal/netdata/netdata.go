// Package netdata is what the sriov CNI tells fastpath's DRA driver after
// it attached a VF the driver prepared: the VF's interface in the pod, so
// that the driver publishes it in the claim's device metadata (KEP-5304's
// networkData) before the pod's containers start. The protocol is JSON
// over HTTP on a unix socket in the driver's plugin directory; the client
// side is here, the server is the driver's (cmd/rdma-device-plugin's
// internal/dra).
package netdata

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
)

// SocketName is the socket's name in the driver's plugin directory.
const SocketName = "cni.sock"

// DefaultSocket is the socket under the driver's default plugin directory
// (/var/lib/kubelet/plugins/<driver>).
const DefaultSocket = "/var/lib/kubelet/plugins/rdma.fastpath-k8s.io/" + SocketName

// Path is the one endpoint: POST a Request.
const Path = "/v1/network-data"

// Request is one VF attached to a pod.
type Request struct {
	// PCIAddress is the VF's.
	PCIAddress string `json:"pciAddress"`
	// The pod, from the runtime's CNI_ARGS (K8S_POD_*).
	PodNamespace string `json:"podNamespace"`
	PodName      string `json:"podName"`
	PodUID       string `json:"podUID"`
	// InterfaceName is the VF's name in the pod (CNI_IFNAME, "net1").
	InterfaceName string `json:"interfaceName"`
	// HardwareAddress is its MAC, "" when it has none (a vfio VF).
	HardwareAddress string `json:"hardwareAddress,omitempty"`
	// IPs are its addresses in CIDR notation, as the CNI result has them.
	IPs []string `json:"ips,omitempty"`
}

// Response is the driver's answer to a Request it took.
type Response struct {
	// Claim ("namespace/name") and Request are the claim request whose
	// metadata now has the VF's network data.
	Claim   string `json:"claim"`
	Request string `json:"request"`
}

// ErrNoSocket is Send's error when the socket does not exist: no driver
// runs on the node, or it lives elsewhere.
var ErrNoSocket = errors.New("no DRA driver socket")

// Send posts req to the driver listening on socket and returns its answer.
// A refusal is an error with the driver's reason; ctx bounds the call.
func Send(ctx context.Context, socket string, req Request) (*Response, error) {
	if _, err := os.Stat(socket); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist (is the DRA driver running on this node? if it listens elsewhere, set draSocket in the sriov CNI's node config, /etc/cni/net.d/fastpath.d/sriov.json)", ErrNoSocket, socket)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("network data for VF %s: %w", req.PCIAddress, err)
	}
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://dra"+Path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(hr)
	if err != nil {
		return nil, fmt.Errorf("DRA driver on %s: %w", socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("DRA driver on %s: read answer: %w", socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("DRA driver on %s refused (%s): %s", socket, resp.Status, strings.TrimSpace(string(data)))
	}
	var out Response
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("DRA driver on %s: answer %q: %w", socket, data, err)
	}
	return &out, nil
}
