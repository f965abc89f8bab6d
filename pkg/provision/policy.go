// Package provision creates a node's VFs from the SR-IOV Network
// Operator's SriovNetworkNodePolicy, without the operator: it reads the
// policies users already have (Parse), matches them against the node's
// PFs (NewPlan: which PF gets how many VFs, bound to which driver, with
// which InfiniBand GUIDs), and carries the plan out through one narrow
// Kernel interface (Applier), with a write-ahead record per PF so that a
// run cut short is finished by the next one. The VFs a policy creates
// feed the pool its resourceName names (Resources).
package provision

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// Device types a policy binds VFs to.
const (
	DeviceTypeNetdevice = "netdevice"
	DeviceTypeVFIO      = "vfio-pci"
)

// Link types of a policy (the operator's linkType, lower-cased).
const (
	LinkTypeEth = "eth"
	LinkTypeIB  = "ib"
)

// DefaultPriority is a policy's priority when it gives none: the
// operator's documented default, its lowest (0 is the highest).
const DefaultPriority = 99

// GUIDsAnnotation on a policy gives the InfiniBand GUIDs of its VFs
// instead of the derived ones: a JSON object from PF (netdev name or PCI
// address) to the GUIDs of its VFs in index order, e.g.
// {"ibp24s0": ["02:00:00:00:00:18:00:01", …]}.
const GUIDsAnnotation = "fastpath-k8s.io/vf-guids"

// Policy is one SriovNetworkNodePolicy's spec, checked.
type Policy struct {
	Name string // metadata.name
	// Source says where the policy was read ("policies.yaml[2]").
	Source       string
	ResourceName string
	NodeSelector map[string]string
	Priority     int // 0 (highest) to 99
	MTU          int // 0: leave the PF's MTU alone
	NumVFs       int
	Vendor       string // "15b3", "" for any
	DeviceID     string // the PF's device ID, "" for any
	PFNames      []pool.VFSet
	RootDevices  []pool.VFSet
	DeviceType   string // DeviceTypeNetdevice or DeviceTypeVFIO
	IsRdma       bool
	LinkType     string // LinkTypeEth, LinkTypeIB or "" (any)
	// ExcludeTopology is passed to the pool.
	ExcludeTopology bool
	// ExternallyManaged: the VFs are created by someone else; the
	// policy only checks there are enough and feeds the pool.
	ExternallyManaged bool
	// GUIDs are the admin-given GUIDs by PF netdev or address.
	GUIDs map[string][]net.HardwareAddr
}

// document is a policy object as written, every field of the operator's
// v1 API named so that an unknown one is an error, not a silent no-op.
type document struct {
	APIVersion string                     `json:"apiVersion"`
	Kind       string                     `json:"kind"`
	Metadata   map[string]json.RawMessage `json:"metadata"`
	Spec       *spec                      `json:"spec"`
	Status     json.RawMessage            `json:"status"`
}

type spec struct {
	ResourceName      string            `json:"resourceName"`
	NodeSelector      map[string]string `json:"nodeSelector"`
	Priority          *int              `json:"priority"`
	Mtu               int               `json:"mtu"`
	NumVfs            *int              `json:"numVfs"`
	NicSelector       nicSelector       `json:"nicSelector"`
	DeviceType        string            `json:"deviceType"`
	IsRdma            bool              `json:"isRdma"`
	NeedVhostNet      bool              `json:"needVhostNet"`
	LinkType          string            `json:"linkType"`
	EswitchMode       string            `json:"eSwitchMode"`
	VdpaType          string            `json:"vdpaType"`
	ExcludeTopology   bool              `json:"excludeTopology"`
	ExternallyManaged bool              `json:"externallyManaged"`
	Bridge            json.RawMessage   `json:"bridge"`
	ESwitchParams     json.RawMessage   `json:"eSwitchParams"`
}

type nicSelector struct {
	Vendor      string   `json:"vendor"`
	DeviceID    string   `json:"deviceID"`
	RootDevices []string `json:"rootDevices"`
	PfNames     []string `json:"pfNames"`
	NetFilter   string   `json:"netFilter"`
}

// Kinds read.
const (
	KindPolicy     = "SriovNetworkNodePolicy"
	KindPolicyList = "SriovNetworkNodePolicyList"
)

// Load reads and parses a policy file.
func Load(path string) ([]Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read policy file: %w", err)
	}
	ps, err := Parse(data, path)
	if err != nil {
		return nil, fmt.Errorf("policy file %s: %w", path, err)
	}
	return ps, nil
}

// docSep splits a multi-document YAML stream.
var docSep = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

// Parse parses policies: one SriovNetworkNodePolicy, a
// SriovNetworkNodePolicyList (or a v1 List) of them, a JSON array of
// them, or several YAML documents, in YAML or JSON. name says where they
// came from, in errors and Policy.Source.
func Parse(data []byte, name string) ([]Policy, error) {
	var out []Policy
	for d, doc := range docSep.Split(string(data), -1) {
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", d, err)
		}
		js = bytes.TrimSpace(js)
		if len(js) == 0 || string(js) == "null" {
			continue
		}
		items, err := splitItems(js)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", d, err)
		}
		for _, it := range items {
			at := fmt.Sprintf("%s[%d]", name, len(out))
			p, err := parsePolicy(it, at)
			if err != nil {
				return nil, err
			}
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no SriovNetworkNodePolicy in it")
	}
	seen := map[string]string{}
	for _, p := range out {
		if prev, ok := seen[p.Name]; ok {
			return nil, fmt.Errorf("%s: policy %q is defined twice (also %s)", p.Source, p.Name, prev)
		}
		seen[p.Name] = p.Source
	}
	return out, nil
}

// splitItems returns the policy objects of one document.
func splitItems(js []byte) ([]json.RawMessage, error) {
	if js[0] == '[' {
		var items []json.RawMessage
		if err := json.Unmarshal(js, &items); err != nil {
			return nil, err
		}
		return items, nil
	}
	var head struct {
		Kind  string            `json:"kind"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(js, &head); err != nil {
		return nil, fmt.Errorf("want a SriovNetworkNodePolicy object or a list of them: %w", err)
	}
	switch head.Kind {
	case KindPolicyList, "List":
		return head.Items, nil
	}
	return []json.RawMessage{js}, nil
}

// exactKeys checks that every key of the object js is one of the json
// tags of v's type, spelled exactly: encoding/json matches keys without
// regard to case, the API server does not, and "numVFs" must not pass
// for "numVfs".
func exactKeys(js json.RawMessage, v any, at string) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(js, &obj); err != nil {
		return nil // not an object: the typed decode says so
	}
	t := reflect.TypeOf(v)
	known := map[string]bool{}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		known[name] = true
	}
	for k := range obj {
		if !known[k] {
			return fmt.Errorf("%s: unknown field %q (fields are the SR-IOV Network Operator's sriovnetwork.openshift.io/v1 SriovNetworkNodePolicy, spelled exactly)", at, k)
		}
	}
	return nil
}

func parsePolicy(js json.RawMessage, at string) (Policy, error) {
	var raw struct {
		Spec json.RawMessage `json:"spec"`
	}
	if err := exactKeys(js, document{}, at); err != nil {
		return Policy{}, err
	}
	if err := json.Unmarshal(js, &raw); err == nil && raw.Spec != nil {
		if err := exactKeys(raw.Spec, spec{}, at+": spec"); err != nil {
			return Policy{}, err
		}
		var sel struct {
			NicSelector json.RawMessage `json:"nicSelector"`
		}
		if err := json.Unmarshal(raw.Spec, &sel); err == nil && sel.NicSelector != nil {
			if err := exactKeys(sel.NicSelector, nicSelector{}, at+": spec.nicSelector"); err != nil {
				return Policy{}, err
			}
		}
	}
	var doc document
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return Policy{}, fmt.Errorf("%s: %w (fields are the SR-IOV Network Operator's sriovnetwork.openshift.io/v1 SriovNetworkNodePolicy)", at, err)
	}
	if doc.Kind != "" && doc.Kind != KindPolicy {
		return Policy{}, fmt.Errorf("%s: kind %q: want %s", at, doc.Kind, KindPolicy)
	}
	var name string
	if raw, ok := doc.Metadata["name"]; ok {
		if err := json.Unmarshal(raw, &name); err != nil {
			return Policy{}, fmt.Errorf("%s: metadata.name: %w", at, err)
		}
	}
	if name == "" {
		return Policy{}, fmt.Errorf("%s: metadata.name is required", at)
	}
	at = fmt.Sprintf("%s (%s)", at, name)
	if doc.Spec == nil {
		return Policy{}, fmt.Errorf("%s: spec is required", at)
	}
	p, err := checkSpec(doc.Spec, at)
	if err != nil {
		return Policy{}, err
	}
	p.Name, p.Source = name, at
	if raw, ok := doc.Metadata["annotations"]; ok {
		var ann map[string]string
		if err := json.Unmarshal(raw, &ann); err != nil {
			return Policy{}, fmt.Errorf("%s: metadata.annotations: %w", at, err)
		}
		if v, ok := ann[GUIDsAnnotation]; ok {
			if p.GUIDs, err = parseGUIDs(v); err != nil {
				return Policy{}, fmt.Errorf("%s: annotation %s: %w", at, GUIDsAnnotation, err)
			}
		}
	}
	return p, nil
}

// resourceNameRE is what sriov-network-device-plugin accepts as a
// resource name (the operator's webhook checks the same).
var resourceNameRE = regexp.MustCompile(`^[a-zA-Z0-9_]+$`)

func checkSpec(s *spec, at string) (Policy, error) {
	p := Policy{ResourceName: s.ResourceName, NodeSelector: s.NodeSelector, Priority: DefaultPriority,
		MTU: s.Mtu, IsRdma: s.IsRdma, ExcludeTopology: s.ExcludeTopology, ExternallyManaged: s.ExternallyManaged}
	fail := func(format string, args ...any) (Policy, error) {
		return Policy{}, fmt.Errorf("%s: spec.%s", at, fmt.Sprintf(format, args...))
	}
	if !resourceNameRE.MatchString(s.ResourceName) {
		return fail("resourceName %q: want letters, digits and '_' (the pool's name, e.g. mlnx_sriov_rdma)", s.ResourceName)
	}
	if s.Priority != nil {
		if *s.Priority < 0 || *s.Priority > 99 {
			return fail("priority %d: want 0 (highest) to 99", *s.Priority)
		}
		p.Priority = *s.Priority
	}
	if s.Mtu < 0 {
		return fail("mtu %d: want 1 or more", s.Mtu)
	}
	if s.NumVfs == nil {
		return fail("numVfs is required")
	}
	if *s.NumVfs < 0 {
		return fail("numVfs %d: want 0 or more", *s.NumVfs)
	}
	p.NumVFs = *s.NumVfs
	switch s.DeviceType {
	case "", DeviceTypeNetdevice:
		p.DeviceType = DeviceTypeNetdevice
	case DeviceTypeVFIO:
		p.DeviceType = DeviceTypeVFIO
	default:
		return fail("deviceType %q: want netdevice or vfio-pci", s.DeviceType)
	}
	if p.IsRdma && p.DeviceType == DeviceTypeVFIO {
		return fail("isRdma with deviceType vfio-pci: a VF handed to user space whole has no RDMA device; use deviceType netdevice")
	}
	switch strings.ToLower(s.LinkType) {
	case "":
	case LinkTypeEth, LinkTypeIB:
		p.LinkType = strings.ToLower(s.LinkType)
	default:
		return fail("linkType %q: want eth or ib", s.LinkType)
	}
	switch s.EswitchMode {
	case "", "legacy":
	case "switchdev":
		return fail("eSwitchMode switchdev is not supported: fastpath creates legacy-mode VFs only (no representors, no OVS offload); use the SR-IOV Network Operator for switchdev, or drop the field")
	default:
		return fail("eSwitchMode %q: want legacy (switchdev is not supported)", s.EswitchMode)
	}
	if s.NeedVhostNet {
		return fail("needVhostNet is not supported: fastpath does not hand out /dev/vhost-net and /dev/net/tun; drop the field")
	}
	if s.VdpaType != "" {
		return fail("vdpaType %q is not supported: fastpath creates no vDPA devices", s.VdpaType)
	}
	if notEmpty(s.Bridge) || notEmpty(s.ESwitchParams) {
		return fail("bridge and eSwitchParams are for eSwitchMode switchdev, which fastpath does not support")
	}
	if err := checkNicSelector(&s.NicSelector, &p); err != nil {
		return Policy{}, fmt.Errorf("%s: spec.nicSelector.%w", at, err)
	}
	for _, sets := range [][]pool.VFSet{p.PFNames, p.RootDevices} {
		for _, set := range sets {
			for _, r := range set.Ranges {
				if r[1] >= p.NumVFs {
					return fail("nicSelector: %s#%d-%d: VF %d is not below numVfs %d", set.PF, r[0], r[1], r[1], p.NumVFs)
				}
			}
		}
	}
	return p, nil
}

func notEmpty(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s != "" && s != "null" && s != "{}"
}

func checkNicSelector(n *nicSelector, p *Policy) error {
	if n.NetFilter != "" {
		return fmt.Errorf("netFilter %q is not supported: it selects cloud (OpenStack/AWS) networks, and fastpath provisions bare-metal PFs", n.NetFilter)
	}
	if n.Vendor == "" && n.DeviceID == "" && len(n.RootDevices) == 0 && len(n.PfNames) == 0 {
		return errors.New("is empty: the operator matches no NIC with it; give vendor, deviceID, pfNames or rootDevices")
	}
	if n.Vendor != "" {
		v := strings.ToLower(strings.TrimPrefix(n.Vendor, "0x"))
		if len(v) != 4 || strings.Trim(v, "0123456789abcdef") != "" || v == "ffff" || v == "0000" {
			return fmt.Errorf("vendor %q: want the PF's 4-digit hex PCI vendor ID, e.g. 15b3 (Mellanox/NVIDIA), 8086 (Intel), 14e4 (Broadcom)", n.Vendor)
		}
		p.Vendor = v
	}
	if n.DeviceID != "" {
		id := strings.ToLower(strings.TrimPrefix(n.DeviceID, "0x"))
		if len(id) != 4 || strings.Trim(id, "0123456789abcdef") != "" {
			return fmt.Errorf("deviceID %q: want the PF's 4-digit hex device ID, e.g. 1021", n.DeviceID)
		}
		p.DeviceID = id
	}
	for i, s := range n.PfNames {
		set, err := pool.ParseVFSet(s, false)
		if err != nil {
			return fmt.Errorf("pfNames[%d]: %w", i, err)
		}
		p.PFNames = append(p.PFNames, set)
	}
	for i, s := range n.RootDevices {
		set, err := pool.ParseVFSet(s, true)
		if err != nil {
			return fmt.Errorf("rootDevices[%d]: %w", i, err)
		}
		p.RootDevices = append(p.RootDevices, set)
	}
	return nil
}

// parseGUIDs parses GUIDsAnnotation's value.
func parseGUIDs(v string) (map[string][]net.HardwareAddr, error) {
	var raw map[string][]string
	if err := json.Unmarshal([]byte(v), &raw); err != nil {
		return nil, fmt.Errorf("want a JSON object from PF to a list of GUIDs: %w", err)
	}
	out := map[string][]net.HardwareAddr{}
	seen := map[string]bool{}
	for pf, list := range raw {
		for i, s := range list {
			g, err := net.ParseMAC(s)
			if err != nil || len(g) != 8 {
				return nil, fmt.Errorf("%s[%d]: %q is not a GUID (want 8 bytes, e.g. 02:00:00:00:00:18:00:01)", pf, i, s)
			}
			if seen[g.String()] {
				return nil, fmt.Errorf("%s[%d]: GUID %s is given twice", pf, i, g)
			}
			seen[g.String()] = true
			out[pf] = append(out[pf], g)
		}
	}
	return out, nil
}
