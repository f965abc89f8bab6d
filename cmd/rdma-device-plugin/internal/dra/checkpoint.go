package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fastpath-k8s/fastpath/internal/atomicfile"
)

// CheckpointFile is the name of the checkpoint in the plugin data
// directory.
const CheckpointFile = "checkpoint.json"

// checkpointVersion is bumped when the file's meaning changes; a file of
// another version is refused rather than half understood.
const checkpointVersion = 1

// checkpoint is what outlives the process: every claim prepared and not
// yet unprepared, with what was written for it, so that a restarted
// plugin keeps its claims prepared and still cleans up on Unprepare.
type checkpoint struct {
	Version int                          `json:"version"`
	Claims  map[types.UID]*preparedClaim `json:"claims"`
}

// preparedClaim is one claim as prepared on this node.
type preparedClaim struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Devices   []preparedDevice `json:"devices"`
	// CDISpec is the claim's spec file name in the CDI directory.
	CDISpec string `json:"cdiSpec"`
	// DevInfo are the device-info files written for the claim's VFs.
	DevInfo []string `json:"devInfo,omitempty"`
	// Env are the PCI addresses of the VFs its spec's environment names
	// when they are not its own (envPeers: its pod's other claims' too),
	// so that a spec written again (restoreFiles) names the same.
	Env []string `json:"env,omitempty"`
	// Pods are the pods the claim was reserved for at Prepare
	// (status.reservedFor): those whose CNI may publish a VF's network
	// data (netdata.go) without asking the API server.
	Pods []types.UID `json:"pods,omitempty"`
}

// preparedDevice is one of the claim's allocation results of this driver.
type preparedDevice struct {
	Request    string `json:"request"`
	Pool       string `json:"pool"`
	Device     string `json:"device"`
	PCIAddress string `json:"pciAddress"`
	Resource   string `json:"resource"`
	// CDIDeviceID is the CDI name the device was prepared under and the
	// kubelet was given: "rdma.fastpath-k8s.io/vf=<bdf>", or in the
	// claim's own class (AdminCDIClass) for a claim with admin access. A
	// restarted plugin answers a Prepare of a claim whose VFs left the
	// scan with it.
	CDIDeviceID string `json:"cdiDeviceID"`
	AdminAccess bool   `json:"adminAccess,omitempty"`
	// Metadata are the attributes of the device's metadata file
	// (deviceMetadata), kept so that a restarted plugin that answers a
	// Prepare from the checkpoint has the helper rewrite the same file.
	// A checkpoint written before metadata has none: the file is then
	// rewritten without attributes.
	Metadata map[string]resourceapi.DeviceAttribute `json:"metadata,omitempty"`
	// NetworkData is the VF's interface in its pod as the CNI told it
	// after its ADD (netdata.go), kept for the same reason.
	NetworkData *resourceapi.NetworkDeviceData `json:"networkData,omitempty"`
}

// loadCheckpoint reads path; a missing file is an empty checkpoint.
func loadCheckpoint(path string) (*checkpoint, error) {
	cp := &checkpoint{Version: checkpointVersion, Claims: map[types.UID]*preparedClaim{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cp, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dra checkpoint: %w", err)
	}
	var got checkpoint
	if err := json.Unmarshal(data, &got); err != nil {
		return nil, fmt.Errorf("dra checkpoint %s: %w (the claims it lists cannot be cleaned up: remove their CDI specs from the CDI directory and then the file, or restore it)", path, err)
	}
	if got.Version != checkpointVersion {
		return nil, fmt.Errorf("dra checkpoint %s: version %d, this plugin reads version %d", path, got.Version, checkpointVersion)
	}
	if got.Claims != nil {
		cp.Claims = got.Claims
	}
	return cp, nil
}

// save writes the checkpoint atomically.
func (cp *checkpoint) save(path string) error {
	data, err := json.Marshal(cp)
	if err != nil {
		return fmt.Errorf("dra checkpoint: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("dra checkpoint: %w", err)
	}
	if err := atomicfile.Write(path, data, 0o600); err != nil {
		return fmt.Errorf("dra checkpoint: %w", err)
	}
	return nil
}

// owner returns the claim that holds the VF at a PCI address (not for
// admin access), other than except.
func (cp *checkpoint) owner(pciAddress string, except types.UID) (types.UID, *preparedClaim) {
	for uid, c := range cp.Claims {
		if uid == except {
			continue
		}
		for _, d := range c.Devices {
			if d.PCIAddress == pciAddress && !d.AdminAccess {
				return uid, c
			}
		}
	}
	return "", nil
}

// inUse are the PCI addresses of VFs prepared for a claim.
func (cp *checkpoint) inUse() map[string]bool {
	out := map[string]bool{}
	for _, c := range cp.Claims {
		for _, d := range c.Devices {
			out[d.PCIAddress] = true
		}
	}
	return out
}

// PreparedVFs reads the checkpoint in pluginDir and names, by PCI
// address, the claim each prepared VF is for ("claim ns/name"): what
// must not be taken away while a pod runs with it. A missing checkpoint
// has none.
func PreparedVFs(pluginDir string) (map[string]string, error) {
	cp, err := loadCheckpoint(filepath.Join(pluginDir, CheckpointFile))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, c := range cp.Claims {
		for _, d := range c.Devices {
			if d.PCIAddress != "" {
				out[d.PCIAddress] = "DRA claim " + c.Namespace + "/" + c.Name
			}
		}
	}
	return out, nil
}
