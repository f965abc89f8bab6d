package plugin

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// Defaults for fields a conf may leave out.
const (
	DefaultStateDir           = "/var/lib/cni/sriov"
	DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"
)

// NetConf is the plugin's network configuration.
type NetConf struct {
	types.PluginConf

	// DeviceID is the VF's PCI address; Multus injects it (and PCIBusID)
	// from the device plugin's allocation.
	DeviceID string `json:"deviceID,omitempty"`
	PCIBusID string `json:"pciBusID,omitempty"`
	// ResourceName is the device plugin resource the VF comes from; with
	// no deviceID, the kubelet's PodResources API says which VF of it the
	// pod holds.
	ResourceName string `json:"resourceName,omitempty"`
	// PodResourcesSocket, StateDir and DRASocket are the node's
	// (NodeConfig): a conf may leave them out or spell the node's own
	// value, which older confs do; any other value is refused
	// (checkNodePaths). They are never used.
	PodResourcesSocket string `json:"podResourcesSocket,omitempty"`
	StateDir           string `json:"stateDir,omitempty"`
	DRASocket          string `json:"draSocket,omitempty"`

	// VF settings, applied on the PF.
	Vlan      *int   `json:"vlan,omitempty"`
	VlanQoS   *int   `json:"vlanQoS,omitempty"`
	VlanProto string `json:"vlanProto,omitempty"`
	MAC       string `json:"mac,omitempty"`
	SpoofChk  string `json:"spoofchk,omitempty"`
	Trust     string `json:"trust,omitempty"`
	LinkState string `json:"link_state,omitempty"`
	MinTxRate *int   `json:"min_tx_rate,omitempty"`
	MaxTxRate *int   `json:"max_tx_rate,omitempty"`
	GUID      string `json:"guid,omitempty"`
	// PKey is ib-sriov-cni's partition key, which this plugin does not
	// set: a conf that has one is refused rather than have its VF join
	// the default partition unannounced.
	PKey string `json:"pkey,omitempty"`
	// MTU is set on the VF netdev.
	MTU *int `json:"mtu,omitempty"`
	// RDMAIsolation requires the RDMA device to move with the netdev
	// (RDMA subsystem in exclusive netns mode).
	RDMAIsolation bool `json:"rdmaIsolation,omitempty"`

	LogLevel string `json:"logLevel,omitempty"`
	// LogFile is used only inside the node's LogDir (Plugin.logger);
	// elsewhere it is ignored with a warning.
	LogFile string `json:"logFile,omitempty"`

	RuntimeConfig RuntimeConfig `json:"runtimeConfig,omitempty"`

	// Parsed forms, filled by parseConf.
	vf       sriov.Settings `json:"-"`
	logLevel slog.Level     `json:"-"`
}

// RuntimeConfig holds the capability arguments the runtime passes.
type RuntimeConfig struct {
	DeviceID          string   `json:"deviceID,omitempty"`
	MAC               string   `json:"mac,omitempty"`
	IPs               []string `json:"ips,omitempty"`
	InfinibandGUID    string   `json:"infinibandGUID,omitempty"`
	CNIDeviceInfoFile string   `json:"CNIDeviceInfoFile,omitempty"`
}

// logLevels are the logLevel values upstream sriov-cni and the SR-IOV
// Network Operator (SriovNetwork.spec.logLevel) write, and "warn". This
// plugin never panics on purpose: "panic" logs errors only, as close as
// slog comes to upstream's "panic messages only".
var logLevels = map[string]slog.Level{
	"": slog.LevelInfo, "debug": slog.LevelDebug, "info": slog.LevelInfo,
	"warn": slog.LevelWarn, "warning": slog.LevelWarn, "error": slog.LevelError, "panic": slog.LevelError,
}

// parseConf decodes and validates stdin. Every check that needs no
// knowledge of the node happens here, before anything changes.
func parseConf(data []byte) (*NetConf, error) {
	c := &NetConf{}
	if err := json.Unmarshal(data, c); err != nil {
		return nil, invalidConf("parse network configuration: %v", err)
	}
	if c.Type != "" && c.Type != "sriov" {
		// A conf written for another plugin would be a puzzling failure
		// later; say so now.
		hint := ""
		if c.Type == "ib-sriov" {
			hint = ` (a NetworkAttachmentDefinition written for ib-sriov-cni works with "type": "sriov")`
		}
		return nil, invalidConf("type %q: this plugin is \"sriov\"%s", c.Type, hint)
	}
	if c.PKey != "" {
		return nil, invalidConf("pkey %q: this plugin does not set InfiniBand partition keys (ib-sriov-cni's field); the VF would stay in the default partition: drop pkey to accept that, or keep ib-sriov-cni for this network", c.PKey)
	}
	if c.CNIVersion == "" {
		// The spec's default, as skel's version check reads it.
		c.CNIVersion = "0.1.0"
	}
	if c.RawPrevResult != nil {
		if err := version.ParsePrevResult(&c.PluginConf); err != nil {
			return nil, invalidConf("prevResult: %v", err)
		}
	}
	if c.ResourceName != "" && strings.Count(c.ResourceName, "/") != 1 {
		return nil, invalidConf("resourceName %q: want <prefix>/<name>, e.g. mellanox.com/mlnx_sriov_rdma", c.ResourceName)
	}
	for _, id := range []struct{ field, v string }{
		{"deviceID", c.DeviceID}, {"pciBusID", c.PCIBusID}, {"runtimeConfig.deviceID", c.RuntimeConfig.DeviceID},
	} {
		if id.v != "" && !pci.ValidAddress(id.v) {
			return nil, invalidConf("%s %q: not a PCI address (want DDDD:BB:DD.F, lower-case hex)", id.field, id.v)
		}
	}
	if c.RuntimeConfig.CNIDeviceInfoFile != "" && !filepath.IsAbs(c.RuntimeConfig.CNIDeviceInfoFile) {
		return nil, invalidConf("runtimeConfig.CNIDeviceInfoFile %q: want an absolute path", c.RuntimeConfig.CNIDeviceInfoFile)
	}
	if err := c.parseVF(); err != nil {
		return nil, err
	}
	if c.MTU != nil && (*c.MTU < 68 || *c.MTU > 65535) {
		return nil, invalidConf("mtu %d: want 68-65535", *c.MTU)
	}
	if c.LogFile != "" && !filepath.IsAbs(c.LogFile) {
		return nil, invalidConf("logFile %q: want an absolute path", c.LogFile)
	}
	level, ok := logLevels[strings.ToLower(c.LogLevel)]
	if !ok {
		return nil, invalidConf("logLevel %q: want panic, error, warning, info or debug", c.LogLevel)
	}
	c.logLevel = level
	return c, nil
}

func (c *NetConf) parseVF() error {
	v := &c.vf
	if c.Vlan != nil {
		if *c.Vlan < 0 || *c.Vlan > 4094 {
			return invalidConf("vlan %d: want 0-4094", *c.Vlan)
		}
		v.Vlan = c.Vlan
	}
	if c.VlanQoS != nil {
		if *c.VlanQoS < 0 || *c.VlanQoS > 7 {
			return invalidConf("vlanQoS %d: want 0-7", *c.VlanQoS)
		}
		if *c.VlanQoS != 0 && (c.Vlan == nil || *c.Vlan == 0) {
			return invalidConf("vlanQoS %d needs a non-zero vlan", *c.VlanQoS)
		}
		v.VlanQoS = c.VlanQoS
	}
	if c.VlanProto != "" {
		var p int
		switch strings.ToLower(c.VlanProto) {
		case "802.1q":
			p = sriov.VlanProto8021Q
		case "802.1ad":
			p = sriov.VlanProto8021AD
		default:
			return invalidConf("vlanProto %q: want 802.1q or 802.1ad", c.VlanProto)
		}
		if p == sriov.VlanProto8021AD && (c.Vlan == nil || *c.Vlan == 0) {
			return invalidConf("vlanProto 802.1ad needs a non-zero vlan")
		}
		v.VlanProto = &p
	}
	mac, field := c.MAC, "mac"
	if c.RuntimeConfig.MAC != "" {
		mac, field = c.RuntimeConfig.MAC, "runtimeConfig.mac"
	}
	if mac != "" {
		hw, err := net.ParseMAC(mac)
		if err != nil || len(hw) != 6 {
			return invalidConf("%s %q: not an Ethernet MAC address", field, mac)
		}
		if hw[0]&1 != 0 {
			return invalidConf("%s %q: a multicast address cannot be a VF's MAC", field, mac)
		}
		v.MAC = hw
	}
	for _, f := range []struct {
		field, v string
		dst      **bool
	}{{"spoofchk", c.SpoofChk, &v.SpoofChk}, {"trust", c.Trust, &v.Trust}} {
		switch f.v {
		case "":
		case "on":
			*f.dst = ptr(true)
		case "off":
			*f.dst = ptr(false)
		default:
			return invalidConf("%s %q: want \"on\" or \"off\"", f.field, f.v)
		}
	}
	switch c.LinkState {
	case "":
	case "auto":
		v.LinkState = ptr(uint32(sriov.LinkStateAuto))
	case "enable":
		v.LinkState = ptr(uint32(sriov.LinkStateEnable))
	case "disable":
		v.LinkState = ptr(uint32(sriov.LinkStateDisable))
	default:
		return invalidConf("link_state %q: want auto, enable or disable", c.LinkState)
	}
	if c.MinTxRate != nil && *c.MinTxRate < 0 {
		return invalidConf("min_tx_rate %d: want a non-negative rate in Mbps", *c.MinTxRate)
	}
	if c.MaxTxRate != nil && *c.MaxTxRate < 0 {
		return invalidConf("max_tx_rate %d: want a non-negative rate in Mbps", *c.MaxTxRate)
	}
	if c.MinTxRate != nil && c.MaxTxRate != nil && *c.MaxTxRate != 0 && *c.MinTxRate > *c.MaxTxRate {
		return invalidConf("min_tx_rate %d is above max_tx_rate %d", *c.MinTxRate, *c.MaxTxRate)
	}
	v.MinTxRate, v.MaxTxRate = c.MinTxRate, c.MaxTxRate
	guid, field := c.GUID, "guid"
	if c.RuntimeConfig.InfinibandGUID != "" {
		guid, field = c.RuntimeConfig.InfinibandGUID, "runtimeConfig.infinibandGUID"
	}
	if guid != "" {
		hw, err := net.ParseMAC(guid)
		if err != nil || len(hw) != 8 {
			return invalidConf("%s %q: not an InfiniBand GUID (want 8 bytes, e.g. 00:11:22:33:44:55:66:77)", field, guid)
		}
		if isZero(hw) {
			return invalidConf("%s %q: the zero GUID is not a port GUID", field, guid)
		}
		v.GUID = hw
	}
	return nil
}

// legacyResult reports whether the conf's cniVersion is one whose result
// (0.1.0, 0.2.0) carries only IP addresses: no interfaces, and at least
// one address.
func (c *NetConf) legacyResult() bool {
	ge, err := version.GreaterThanOrEqualTo(c.CNIVersion, "0.3.0")
	return err == nil && !ge
}

// deviceID is the VF PCI address the conf names, or "".
func (c *NetConf) deviceID() string {
	switch {
	case c.RuntimeConfig.DeviceID != "":
		return c.RuntimeConfig.DeviceID
	case c.DeviceID != "":
		return c.DeviceID
	}
	return c.PCIBusID
}

func ptr[T any](v T) *T { return &v }

func isZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// invalidConf is a CNI "invalid network config" error (code 7).
func invalidConf(format string, args ...any) error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf(format, args...), "")
}
