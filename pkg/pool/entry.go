package pool

import (
	"fmt"
	"regexp"
	"strings"
)

var (
	topKeys = []string{"periodicUpdateInterval", "configList", "resourceList"}

	sharedKeys = []string{"resourceName", "resourcePrefix", "rdmaHcaMax", "selectors", "devices", "excludeTopology", "ncclEnv"}
	sharedSel  = []string{"vendors", "deviceIDs", "drivers", "ifNames", "linkTypes"}

	exclusiveKeys = []string{"resourceName", "resourcePrefix", "deviceType", "excludeTopology", "selectors", "allocationPolicy", "ncclEnv", "servedBy"}
	exclusiveSel  = []string{"vendors", "devices", "drivers", "pciAddresses", "pfNames", "rootDevices", "linkTypes", "isRdma"}

	// Keys of the upstream formats that fastpath understands but does not
	// serve, with the reason and the value that asks for nothing. Each is
	// ignored while its value is off (false, "", [], {}, 0 or null; see
	// object.fields): the SR-IOV Network Operator marshals
	// sriov-network-device-plugin's own types, whose untagged fields it
	// writes whether set or not ("SelectorObj": null on every entry,
	// "NeedVhostNet": false in every selector).
	unsupportedExclusive = map[string]unsupportedKey{
		"rdmahcamax":     {"rdmaHcaMax applies to configList (shared) pools; a resourceList pool hands out whole VFs", "0"},
		"additionalinfo": {"additionalInfo is not supported: fastpath puts each device's details in PCIDEVICE_<RESOURCE>_INFO", "{}"},
		"selectorobj":    {"SelectorObj is sriov-network-device-plugin's internal field, not configuration; give the selectors in selectors", "null"},
		"selectorobjs":   {"SelectorObjs is sriov-network-device-plugin's internal field, not configuration; give the selectors in selectors", "null"},
	}
	unsupportedSelector = map[string]unsupportedKey{
		"ddpprofiles":  {"ddpProfiles is not supported: fastpath does not read Intel DDP profiles", "[]"},
		"needvhostnet": {"needVhostNet is not supported: fastpath does not hand out /dev/vhost-net", "false"},
		"vdpatype":     {"vdpaType is not supported: fastpath does not hand out vDPA devices", `""`},
		"pkeys":        {"pKeys is not supported: partition keys are not read during discovery", "[]"},
		"acpiindexes":  {"acpiIndexes is not supported", "[]"},
		"auxtypes":     {"auxTypes is not supported: scalable functions are not discovered", "[]"},
	}
	sharedUnsupportedKeys = map[string]unsupportedKey{
		"allocationpolicy": {"allocationPolicy applies to resourceList (exclusive) pools; a shared pool gives every container all its HCAs", `""`},
		"devicetype":       {"deviceType applies to resourceList (exclusive) pools", `""`},
		"servedby":         {"servedBy applies to resourceList (exclusive) pools: DRA hands out whole VFs; shared HCAs are served by the device plugin", `""`},
	}
)

// unsupportedKey says why a key is refused when set, and how to write
// the value that asks for nothing.
type unsupportedKey struct {
	why, off string
}

// names reads resourceName and resourcePrefix and checks them.
func names(e *value, f map[string]*value, r *Resource, defaultPrefix string) error {
	v := f["resourceName"]
	if v == nil {
		return fmt.Errorf("%s: resourceName is required", e.name())
	}
	name, err := v.str()
	if err != nil {
		return err
	}
	r.Prefix = defaultPrefix
	if p := f["resourcePrefix"]; p != nil {
		s, err := p.str()
		if err != nil {
			return err
		}
		if s != "" {
			r.Prefix = s
		}
	}
	// sriov-network-device-plugin accepts "prefix/name" in resourceName.
	if i := strings.IndexByte(name, '/'); i >= 0 {
		if f["resourcePrefix"] != nil {
			return fmt.Errorf("%s: %q has a prefix and resourcePrefix is also set: give one", v.path, name)
		}
		r.Prefix, name = name[:i], name[i+1:]
	}
	r.Name = name
	if !qualifiedName.MatchString(name) || len(name) > 63 {
		return fmt.Errorf("%s: %q is not a valid resource name: want up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", v.path, name)
	}
	if err := CheckPrefix(r.Prefix); err != nil {
		return fmt.Errorf("%s: %w", e.name(), err)
	}
	return nil
}

// Kubernetes' rules for the two halves of an extended resource name.
var (
	qualifiedName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsSubdomain  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// parseShared parses a configList entry; the *bool is its "ncclEnv", nil
// when not given.
func parseShared(e *value, cfg *Config) (Resource, *bool, error) {
	r := Resource{Kind: Shared, Source: e.name(), ServedBy: ServedByDevicePlugin}
	o, err := e.object()
	if err != nil {
		return r, nil, err
	}
	f, err := o.fields(e.path, sharedKeys, sharedUnsupportedKeys)
	if err != nil {
		return r, nil, err
	}
	nccl, err := optTriBool(f["ncclEnv"])
	if err != nil {
		return r, nil, err
	}
	r, err = parseSharedFields(e, f, r, cfg)
	return r, nccl, err
}

func parseSharedFields(e *value, f map[string]*value, r Resource, cfg *Config) (Resource, error) {
	if err := names(e, f, &r, DefaultSharedPrefix); err != nil {
		return r, err
	}
	v := f["rdmaHcaMax"]
	if v == nil {
		return r, fmt.Errorf("%s: rdmaHcaMax is required: how many containers may share the pool's HCAs (at least 1)", e.name())
	}
	n, err := v.integer()
	if err != nil {
		return r, err
	}
	if n < 1 || n > MaxRdmaHcaMax {
		return r, fmt.Errorf("%s: %d: want 1 to %d containers sharing the HCAs", v.path, n, MaxRdmaHcaMax)
	}
	r.RdmaHcaMax = int(n)
	if r.ExcludeTopology, err = optBool(f["excludeTopology"]); err != nil {
		return r, err
	}
	var sel Selector
	if v := f["selectors"]; v != nil {
		o, err := v.object()
		if err != nil {
			return r, fmt.Errorf("%w (a configList entry has one selectors object)", err)
		}
		sf, err := o.fields(v.path, sharedSel, unsupportedSelector)
		if err != nil {
			return r, err
		}
		if sel, err = selector(sf, cfg); err != nil {
			return r, err
		}
	}
	// The legacy format lists interface names in "devices".
	if v := f["devices"]; v != nil {
		if len(sel.IfNames) > 0 {
			return r, fmt.Errorf("%s: give the interfaces either in devices (legacy) or in selectors.ifNames, not both", v.path)
		}
		if sel.IfNames, err = ifNames(v); err != nil {
			return r, err
		}
	}
	if sel.empty() {
		return r, fmt.Errorf("%s: no selectors: a shared pool must say which HCAs it takes (e.g. selectors.vendors, deviceIDs, ifNames)", e.name())
	}
	r.Selectors = []Selector{sel}
	return r, nil
}

// parseExclusive parses a resourceList entry; the *bool is its
// "ncclEnv", nil when not given.
func parseExclusive(e *value, cfg *Config, prefix string) (Resource, *bool, error) {
	r := Resource{Kind: Exclusive, Source: e.name(), DeviceType: "netDevice", ServedBy: ServedByDevicePlugin}
	o, err := e.object()
	if err != nil {
		return r, nil, err
	}
	f, err := o.fields(e.path, exclusiveKeys, unsupportedExclusive)
	if err != nil {
		return r, nil, err
	}
	nccl, err := optTriBool(f["ncclEnv"])
	if err != nil {
		return r, nil, err
	}
	r, err = parseExclusiveFields(e, f, r, cfg, prefix)
	return r, nccl, err
}

func parseExclusiveFields(e *value, f map[string]*value, r Resource, cfg *Config, prefix string) (Resource, error) {
	var err error
	if err := names(e, f, &r, prefix); err != nil {
		return r, err
	}
	if v := f["deviceType"]; v != nil {
		s, err := v.str()
		if err != nil {
			return r, err
		}
		switch strings.ToLower(s) {
		case "netdevice", "":
		case "accelerator":
			r.DeviceType = "accelerator"
		case "auxnetdevice":
			return r, fmt.Errorf("%s: %q is not supported: scalable functions are not discovered; use netDevice VFs", v.path, s)
		default:
			return r, fmt.Errorf("%s: %q: want netDevice or accelerator", v.path, s)
		}
	}
	if r.ExcludeTopology, err = optBool(f["excludeTopology"]); err != nil {
		return r, err
	}
	if v := f["allocationPolicy"]; v != nil {
		s, err := v.str()
		if err != nil {
			return r, err
		}
		switch s {
		case PolicyPack, PolicySpread:
			r.AllocationPolicy = s
		default:
			return r, fmt.Errorf("%s: %q: want %q (VFs of as few PFs as possible) or %q (one VF per PF)", v.path, s, PolicyPack, PolicySpread)
		}
	}
	if err := servedBy(f["servedBy"], &r); err != nil {
		return r, err
	}
	v := f["selectors"]
	if v == nil {
		return r, fmt.Errorf("%s: selectors are required: say which VFs the pool takes (e.g. vendors, devices, pfNames)", e.name())
	}
	// One selector object, or a list of them.
	var objs []*value
	if _, ok := v.v.(*object); ok {
		objs = []*value{v}
	} else if objs, err = v.list(); err != nil {
		return r, fmt.Errorf("%s: want a selector object or a list of them, got %s", v.path, kindOf(v.v))
	}
	if len(objs) == 0 {
		return r, fmt.Errorf("%s: empty list: give at least one selector", v.path)
	}
	for _, sv := range objs {
		o, err := sv.object()
		if err != nil {
			return r, err
		}
		sf, err := o.fields(sv.path, exclusiveSel, unsupportedSelector)
		if err != nil {
			return r, err
		}
		sel, err := selector(sf, cfg)
		if err != nil {
			return r, err
		}
		if sel.empty() {
			return r, fmt.Errorf("%s: empty selector would take every NIC function of the node; name at least one of %s", sv.name(), strings.Join(exclusiveSel, ", "))
		}
		r.Selectors = append(r.Selectors, sel)
	}
	return r, nil
}

// optTriBool is nil for a key not given.
func optTriBool(v *value) (*bool, error) {
	if v == nil {
		return nil, nil
	}
	b, err := v.boolean()
	if err != nil {
		return nil, err
	}
	return &b, nil
}

func optBool(v *value) (bool, error) {
	if v == nil {
		return false, nil
	}
	return v.boolean()
}
