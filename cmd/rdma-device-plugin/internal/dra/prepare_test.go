package dra_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/dra"
)

// runtime loads the CDI directory as a container runtime does, from a
// copy whose device nodes' host paths are /dev/null: the fixture's /dev
// entries are plain files, and the runtime stats a node's host path to
// learn its type and numbers. The nodes' container paths are kept.
func (e *testEnv) runtime(t testing.TB) *cdi.Cache {
	t.Helper()
	dir := t.TempDir()
	files, err := filepath.Glob(filepath.Join(e.cdiDir, "*.json"))
	require.NoError(t, err)
	for _, f := range files {
		sp, err := cdi.ReadSpec(f, 0)
		require.NoError(t, err)
		raw := *sp.Spec
		nodes := func(list []*cdispec.DeviceNode) []*cdispec.DeviceNode {
			var out []*cdispec.DeviceNode
			for _, n := range list {
				c := *n
				c.HostPath = "/dev/null"
				out = append(out, &c)
			}
			return out
		}
		raw.ContainerEdits.DeviceNodes = nodes(raw.ContainerEdits.DeviceNodes)
		raw.Devices = slices.Clone(raw.Devices)
		for i := range raw.Devices {
			raw.Devices[i].ContainerEdits.DeviceNodes = nodes(raw.Devices[i].ContainerEdits.DeviceNodes)
		}
		data, err := json.Marshal(raw)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o644))
	}
	c, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	require.NoError(t, err)
	require.Empty(t, c.GetErrors())
	return c
}

// container is what a runtime gives a container that references the CDI
// devices ids: its environment and the paths of its device nodes.
type container struct {
	env   map[string]string
	nodes []string
}

func inject(t testing.TB, rc *cdi.Cache, ids ...string) container {
	t.Helper()
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	unresolved, err := rc.InjectDevices(spec, ids...)
	require.NoError(t, err)
	require.Empty(t, unresolved)
	out := container{env: map[string]string{}}
	for _, kv := range spec.Process.Env {
		k, v, ok := strings.Cut(kv, "=")
		require.True(t, ok, kv)
		out.env[k] = v
	}
	for _, d := range spec.Linux.Devices {
		out.nodes = append(out.nodes, d.Path)
	}
	return out
}

// cdiIDs are the CDI devices of prepared claims' responses, in order.
func cdiIDs(t testing.TB, resp map[string]*drapbv1.NodePrepareResourceResponse, claims ...*resourceapi.ResourceClaim) []string {
	t.Helper()
	var ids []string
	for _, c := range claims {
		r := resp[string(c.UID)]
		require.NotNil(t, r, c.Name)
		require.Empty(t, r.Error, c.Name)
		for _, d := range r.Devices {
			ids = append(ids, d.CdiDeviceIds...)
		}
	}
	return ids
}

const envPool = "PCIDEVICE_MELLANOX_COM_MLNX_SRIOV_RDMA"

// specFiles are the CDI directory's specs, by name.
func specFiles(t testing.TB, e *testEnv) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(e.cdiDir, "*.json"))
	require.NoError(t, err)
	out := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		out[filepath.Base(f)] = string(data)
	}
	return out
}

// Admin access lets a claim prepare a VF that another claim holds: each
// claim's spec must define CDI names of its own, or the runtime's cache
// drops the name both define and neither pod's container starts.
func TestAdminCDINames(t *testing.T) {
	admin := func(e *testEnv, t *testing.T, name, addr string) *resourceapi.ResourceClaim {
		c := e.claim(t, name, vf("vf", addr))
		yes := true
		c.Status.Allocation.Devices.Results[0].AdminAccess = &yes
		c, err := e.client.ResourceV1().ResourceClaims(c.Namespace).Update(context.Background(), c, metav1UpdateOptions)
		require.NoError(t, err)
		return c
	}
	for _, tc := range []struct {
		name   string
		claims func(e *testEnv, t *testing.T) []*resourceapi.ResourceClaim
	}{
		{"normal+admin", func(e *testEnv, t *testing.T) []*resourceapi.ResourceClaim {
			return []*resourceapi.ResourceClaim{e.claim(t, "train", vf("vf", rail0vf0)), admin(e, t, "debug", rail0vf0)}
		}},
		{"admin+admin", func(e *testEnv, t *testing.T) []*resourceapi.ResourceClaim {
			return []*resourceapi.ResourceClaim{admin(e, t, "debug-a", rail0vf0), admin(e, t, "debug-b", rail0vf0)}
		}},
		{"normal+2admins", func(e *testEnv, t *testing.T) []*resourceapi.ResourceClaim {
			return []*resourceapi.ResourceClaim{admin(e, t, "debug-a", rail0vf0), e.claim(t, "train", vf("vf", rail0vf0)), admin(e, t, "debug-b", rail0vf0)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
			d := e.start(t)
			k := e.register(t)
			claims := tc.claims(e, t)
			// Prepared one by one (pods of their own) — the runtime's
			// cache, as containerd keeps one, refreshed after each.
			rc, err := cdi.NewCache(cdi.WithSpecDirs(e.cdiDir), cdi.WithAutoRefresh(false))
			require.NoError(t, err)
			ids := map[types.UID][]string{}
			for _, c := range claims {
				ids[c.UID] = cdiIDs(t, k.prepare(t, c), c)
				require.NoError(t, rc.Refresh())
				require.Empty(t, rc.GetErrors())
			}
			seen := map[string]bool{}
			for _, c := range claims {
				require.Len(t, ids[c.UID], 1)
				id := ids[c.UID][0]
				require.False(t, seen[id], "%s: %s is another claim's", c.Name, id)
				seen[id] = true
				require.True(t, strings.HasSuffix(id, "="+rail0vf0), "%s: Multus takes the deviceID after =", id)
				if c.Status.Allocation.Devices.Results[0].AdminAccess == nil {
					require.Equal(t, dra.CDIDeviceID(rail0vf0), id, "a normal claim keeps vf=<bdf>")
				} else {
					require.Equal(t, "rdma.fastpath-k8s.io/"+dra.AdminCDIClass(c.UID)+"="+rail0vf0, id)
				}
				require.Contains(t, rc.ListDevices(), id)
				require.NotNil(t, rc.GetDevice(id), id)
				got := inject(t, e.runtime(t), id)
				require.Contains(t, got.nodes, "/dev/infiniband/uverbs14", c.Name)
				require.Equal(t, rail0vf0, got.env[envPool], c.Name)
			}

			// After a restart the plugin still answers with the names it
			// gave, and Unprepare removes each claim's spec alone.
			d.Stop()
			e.start(t)
			k = e.register(t)
			for _, c := range claims {
				require.Equal(t, ids[c.UID], cdiIDs(t, k.prepare(t, c), c), c.Name)
			}
			for i, c := range claims {
				require.Empty(t, k.unprepare(t, c)[string(c.UID)].Error)
				require.NoFileExists(t, filepath.Join(e.cdiDir, dra.CDISpecName(c.UID)))
				require.NoError(t, rc.Refresh())
				require.Empty(t, rc.GetErrors())
				for _, o := range claims[i+1:] {
					require.NotNil(t, rc.GetDevice(ids[o.UID][0]), "%s outlives %s", o.Name, c.Name)
				}
			}
			require.Empty(t, specFiles(t, e))
		})
	}
}
