package doctor

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// CNIPath is the import path of fastpath's CNI plugin.
const CNIPath = "github.com/fastpath-k8s/fastpath/cmd/sriov-cni"

// CNIVersions are the CNI spec versions this build's sriov supports; the
// installed binary's VERSION answer must list them all (a test builds
// cmd/sriov-cni and holds it to this list).
var CNIVersions = []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

const versionPkg = "github.com/fastpath-k8s/fastpath/internal/version"

// binaryBuild reads what the Go toolchain recorded in a binary: its main
// package and the fastpath build it came from (the -X stamps of
// internal/version, else the VCS revision).
func binaryBuild(path string) (mainPath string, b Build, err error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return "", Build{}, err
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "-ldflags":
			for _, f := range strings.Fields(s.Value) {
				if v, ok := strings.CutPrefix(f, versionPkg+".Version="); ok {
					b.Version = v
				}
				if v, ok := strings.CutPrefix(f, versionPkg+".Revision="); ok {
					b.Revision = v
				}
			}
		case "vcs.revision":
			if b.Revision == "" {
				b.Revision = s.Value
			}
		}
	}
	return bi.Path, b, nil
}

// versionAnswer runs the plugin's VERSION command as a runtime does.
func versionAnswer(path string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = []string{"CNI_COMMAND=VERSION", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0"}`)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var v struct {
		SupportedVersions []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return nil, fmt.Errorf("VERSION answer %q: %w", bytes.TrimSpace(out), err)
	}
	return v.SupportedVersions, nil
}

func (h *host) checkCNI() {
	if h.opts.CNIBinDir != "" {
		h.checkCNIBinary()
	}
	if h.opts.CNIConfDir != "" {
		h.checkMultus()
	}
}

func (h *host) checkCNIBinary() {
	const name = "cni"
	dir := h.opts.CNIBinDir
	if _, err := os.Stat(dir); err != nil {
		h.addf(name, Skip, dir, "run doctor on the node, or pass --cni-bin-dir (the runtime's CNI bin_dir: /opt/cni/bin; k3s and OpenShift use others)",
			"cannot check the CNI plugin: %v", err)
		return
	}
	bin := filepath.Join(dir, "sriov")
	fi, err := os.Stat(bin)
	if h.denied(name, bin, err) {
		return
	}
	if err != nil {
		h.addf(name, Fail, bin, "the DaemonSet's init container installs it: kubectl -n fastpath rollout restart ds/rdma-device-plugin, and check that its hostPath is the runtime's CNI bin_dir",
			"%v: every pod attached to a NetworkAttachmentDefinition of type sriov fails to start (failed to find plugin \"sriov\")", err)
		return
	}
	if fi.Mode()&0o111 == 0 {
		h.addf(name, Fail, bin, "chmod 0755 "+bin, "not executable (mode %v)", fi.Mode())
		return
	}
	mainPath, theirs, err := binaryBuild(bin)
	switch {
	case err != nil:
		h.addf(name, Fail, bin, "kubectl -n fastpath rollout restart ds/rdma-device-plugin reinstalls fastpath's; stop whatever installs the other one (the SR-IOV network operator's config daemon does)",
			"not fastpath's sriov: %v", err)
		return
	case mainPath != CNIPath:
		h.addf(name, Fail, bin, "kubectl -n fastpath rollout restart ds/rdma-device-plugin reinstalls fastpath's; stop whatever installs the other one (the SR-IOV network operator's config daemon does)",
			"%s is %s, not fastpath's sriov: it moves the VF but not its RDMA device, and knows nothing of fastpath's device-info", bin, mainPath)
		return
	}
	versions, err := versionAnswer(bin)
	if err != nil {
		h.addf(name, Fail, bin, "reinstall it: kubectl -n fastpath rollout restart ds/rdma-device-plugin (a binary for another CPU architecture fails with exec format error)",
			"VERSION failed: %v", err)
		return
	}
	if missing := slices.DeleteFunc(slices.Clone(CNIVersions), func(v string) bool { return slices.Contains(versions, v) }); len(missing) > 0 {
		h.addf(name, Warn, bin, "kubectl -n fastpath rollout restart ds/rdma-device-plugin installs this build's",
			"answers VERSION with %s; this build's sriov supports %s too: an older build", strings.Join(versions, ", "), strings.Join(missing, ", "))
		return
	}
	ours := h.opts.Build
	switch {
	case theirs.Revision != "" && ours.Revision != "" && theirs.Revision != ours.Revision:
		h.addf(name, Warn, bin, "kubectl -n fastpath rollout restart ds/rdma-device-plugin (its init container installs the plugin's own build)",
			"built from %s (revision %s), this plugin from %s (revision %s): the CNI on the node is not the one this plugin was shipped with",
			orDash(theirs.Version), theirs.Revision, orDash(ours.Version), ours.Revision)
	default:
		rev := theirs.Revision
		if rev == "" {
			rev = "not recorded"
		}
		h.addf(name, OK, bin, "", "fastpath's sriov (revision %s), VERSION answers %s", rev, strings.Join(versions, ", "))
	}
}

// multusTypes are the CNI types of Multus: the thin plugin and the thick
// plugin's shim.
var multusTypes = []string{"multus", "multus-shim"}

// confType is the type of a network config file's first plugin.
func confType(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var c struct {
		Type    string `json:"type"`
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return "", err
	}
	if len(c.Plugins) > 0 {
		return c.Plugins[0].Type, nil
	}
	return c.Type, nil
}

// checkMultus: the runtime (containerd, CRI-O) uses the first network
// config in the directory, in name order; Multus must be it for
// NetworkAttachmentDefinitions to be read at all.
func (h *host) checkMultus() {
	const name = "multus"
	dir := h.opts.CNIConfDir
	ents, err := os.ReadDir(dir)
	if h.denied(name, dir, err) {
		return
	}
	if err != nil {
		st := Skip
		msg := fmt.Sprintf("cannot check the CNI configs: %v (the plugin's pod does not mount them: they hold Multus's kubeconfig)", err)
		if !errors.Is(err, fs.ErrNotExist) {
			st, msg = Warn, fmt.Sprintf("cannot read %s: %v", dir, err)
		}
		h.add(name, st, dir, msg, "run doctor on the node, or pass --cni-conf-dir (the runtime's CNI conf_dir)")
		return
	}
	var confs []string
	for _, e := range ents {
		if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".conf" || ext == ".conflist" || ext == ".json") {
			confs = append(confs, e.Name())
		}
	}
	slices.Sort(confs)
	fix := "install Multus (its DaemonSet writes 00-multus.conf, first in name order)"
	if len(confs) == 0 {
		h.addf(name, Fail, dir, fix, "no network config at all: the node's pods have no network (the runtime reports NetworkPluginNotReady)")
		return
	}
	first, err := confType(filepath.Join(dir, confs[0]))
	if err != nil {
		h.addf(name, Fail, filepath.Join(dir, confs[0]), "fix or remove the file", "the runtime's first network config does not parse: %v", err)
		return
	}
	if slices.Contains(multusTypes, first) {
		h.addf(name, OK, filepath.Join(dir, confs[0]), "", "Multus (%s) is the runtime's network: NetworkAttachmentDefinitions are read", first)
		return
	}
	for _, c := range confs[1:] {
		if t, err := confType(filepath.Join(dir, c)); err == nil && slices.Contains(multusTypes, t) {
			h.addf(name, Fail, filepath.Join(dir, c), "rename it to sort first (e.g. 00-multus.conf), or move "+confs[0]+" away",
				"a Multus config, but the runtime uses %s (type %s), first in name order: the k8s.v1.cni.cncf.io/networks annotation is ignored and pods get no VF netdev", confs[0], first)
			return
		}
	}
	h.addf(name, Fail, dir, fix,
		"no Multus config (the runtime uses %s, type %s): the k8s.v1.cni.cncf.io/networks annotation is ignored, pods get only the default network and NCCL runs NET/Socket over it", confs[0], first)
}
