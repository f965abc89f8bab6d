package dra_test

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
)

// reserve stores a claim's consumers as the scheduler does when it
// reserves the claim for pods.
func (e *testEnv) reserve(t testing.TB, c *resourceapi.ResourceClaim, pods ...types.UID) *resourceapi.ResourceClaim {
	t.Helper()
	c.Status.ReservedFor = nil
	for _, uid := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor,
			resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "pod-" + string(uid), UID: uid})
	}
	got, err := e.client.ResourceV1().ResourceClaims(c.Namespace).Update(context.Background(), c, metav1UpdateOptions)
	require.NoError(t, err)
	return got
}

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

// cdiIDs are the CDI devices of the VFs in prepared claims' responses, in
// order: without the helper's metadata devices (metadataIDs).
func cdiIDs(t testing.TB, resp map[string]*drapbv1.NodePrepareResourceResponse, claims ...*resourceapi.ResourceClaim) []string {
	t.Helper()
	var ids []string
	for _, c := range claims {
		r := resp[string(c.UID)]
		require.NotNil(t, r, c.Name)
		require.Empty(t, r.Error, c.Name)
		for _, d := range r.Devices {
			for _, id := range d.CdiDeviceIds {
				if !strings.HasPrefix(id, dra.MetadataCDIKind+"=") {
					ids = append(ids, id)
				}
			}
		}
	}
	return ids
}

// railVFs are the VF 0 of each of the fixture's rails, in PCI order.
func railVFs(t testing.TB, e *testEnv) []nicDevice {
	t.Helper()
	var out []nicDevice
	for _, p := range e.scan.Pools {
		if !dra.Serves(&p) {
			continue
		}
		for _, d := range p.Devices {
			if d.VFIndex == 0 {
				out = append(out, d)
			}
		}
	}
	slices.SortFunc(out, func(a, b nicDevice) int { return strings.Compare(a.PCIAddress, b.PCIAddress) })
	return out
}

const envPool = "PCIDEVICE_MELLANOX_COM_MLNX_SRIOV_RDMA"

// The Multus pattern: one VF per claim, a claim per rail, all reserved for
// one pod and prepared in one call. Whichever claim's spec the runtime
// applies last, the container is told of every VF it has; each claim's
// CDI device still has its own VF's nodes only.
func TestPrepareOnePodsClaimsNameAllItsVFs(t *testing.T) {
	for _, rails := range []int{2, 8} {
		t.Run(fmt.Sprintf("%d claims", rails), func(t *testing.T) {
			e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
			e.start(t)
			k := e.register(t)
			vfs := railVFs(t, e)
			require.GreaterOrEqual(t, len(vfs), rails)
			vfs = vfs[:rails]
			var claims []*resourceapi.ResourceClaim
			var addrs, hcas []string
			for i, v := range vfs {
				c := e.claim(t, fmt.Sprintf("rank-0-rail%d", i), vf("vf", v.PCIAddress))
				claims = append(claims, e.reserve(t, c, "pod-0"))
				addrs = append(addrs, v.PCIAddress)
				hcas = append(hcas, v.RDMADevice+":1")
			}
			// The kubelet's batch is in the pod's order, whatever it is:
			// the env must not depend on it.
			batch := slices.Clone(claims)
			slices.Reverse(batch)
			resp := k.prepare(t, batch...)
			ids := cdiIDs(t, resp, claims...)
			require.Len(t, ids, rails)

			rc := e.runtime(t)
			want := map[string]string{
				envPool:           strings.Join(addrs, ","),
				"NCCL_IB_HCA":     "=" + strings.Join(hcas, ","),
				"UCX_NET_DEVICES": strings.Join(hcas, ","),
			}
			// Every order of application the runtime might use: the claims
			// in the pod's order and reversed, and each claim alone last.
			reversed := slices.Clone(ids)
			slices.Reverse(reversed)
			orders := [][]string{ids, reversed}
			for _, id := range ids {
				orders = append(orders, append(slices.DeleteFunc(slices.Clone(ids), func(s string) bool { return s == id }), id))
			}
			for _, order := range orders {
				got := inject(t, rc, order...)
				for k, v := range want {
					require.Equal(t, v, got.env[k], "%s with the devices in order %v", k, order)
				}
				var info map[string]plugin.DeviceInfo
				require.NoError(t, json.Unmarshal([]byte(got.env[envPool+"_INFO"]), &info))
				require.Len(t, info, rails)
				for _, v := range vfs {
					require.Equal(t, v.RDMADevice, info[v.PCIAddress].RDMADevice)
					require.Contains(t, info[v.PCIAddress].CharDevices, "/dev/infiniband/rdma_cm")
				}
			}

			// Device nodes stay per claim: a claim's device is its VF's
			// nodes, its spec adds rdma_cm.
			for i, c := range claims {
				got := inject(t, rc, cdiIDs(t, resp, c)...)
				require.ElementsMatch(t, append(vfs[i].CharDevicePaths(), "/dev/infiniband/rdma_cm"), got.nodes, c.Name)
				sp, err := cdi.ReadSpec(filepath.Join(e.cdiDir, dra.CDISpecName(c.UID)), 0)
				require.NoError(t, err)
				require.Len(t, sp.Devices, 1)
				require.Equal(t, vfs[i].PCIAddress, sp.Devices[0].Name)
			}

			// Prepared again as one batch (the kubelet lost its state):
			// the same specs.
			before := specFiles(t, e)
			cdiIDs(t, k.prepare(t, claims...), claims...)
			require.Equal(t, before, specFiles(t, e))
		})
	}
}

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

// Only a claim reserved for exactly one pod names its pod's other claims'
// VFs: a shared claim's other consumers do not have them, and claims of
// another pod, or prepared in another call, are not the pod's peers.
func TestPrepareEnvOfSharedAndLoneClaims(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	e.start(t)
	k := e.register(t)
	vfs := railVFs(t, e)
	require.GreaterOrEqual(t, len(vfs), 5)
	addr := func(i int) string { return vfs[i].PCIAddress }

	// Pod A: two claims of its own and one shared with pod B; pod C: one
	// claim, in the same call.
	a0 := e.reserve(t, e.claim(t, "a-rail0", vf("vf", addr(0))), "pod-a")
	a1 := e.reserve(t, e.claim(t, "a-rail1", vf("vf", addr(1))), "pod-a")
	shared := e.reserve(t, e.claim(t, "shared", vf("vf", addr(2))), "pod-a", "pod-b")
	c0 := e.reserve(t, e.claim(t, "c-rail3", vf("vf", addr(3))), "pod-c")
	resp := k.prepare(t, a0, shared, c0, a1)
	rc := e.runtime(t)
	for _, tc := range []struct {
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{a0, addr(0) + "," + addr(1)},
		{a1, addr(0) + "," + addr(1)},
		{shared, addr(2)},
		{c0, addr(3)},
	} {
		got := inject(t, rc, cdiIDs(t, resp, tc.claim)...)
		require.Equal(t, tc.want, got.env[envPool], tc.claim.Name)
	}
	// Pod A's container with its own claims applied last is told of
	// both of its own VFs (the shared claim cannot name them: pod B does
	// not have them).
	got := inject(t, rc, cdiIDs(t, resp, shared, a1, a0)...)
	require.Equal(t, addr(0)+","+addr(1), got.env[envPool])

	// A claim prepared alone later, for a pod of its own: its own VF,
	// and the specs written before are left as they were.
	before := specFiles(t, e)
	late := e.reserve(t, e.claim(t, "late", vf("vf", addr(4))), "pod-d")
	lateResp := k.prepare(t, late)
	after := specFiles(t, e)
	delete(after, dra.CDISpecName(late.UID))
	delete(after, metadataSpecName(late.UID, "vf"))
	require.Equal(t, before, after)
	rc = e.runtime(t)
	got = inject(t, rc, cdiIDs(t, lateResp, late)...)
	require.Equal(t, addr(4), got.env[envPool])
	require.Equal(t, "="+vfs[4].RDMADevice+":1", got.env["NCCL_IB_HCA"])

	// A claim reserved for nothing (as the tests before this change
	// prepared them) is its own too.
	rail0vf1 := fixture.VFAddress(0x18, 1)
	none := e.claim(t, "none", vf("vf", rail0vf1))
	noneIDs := cdiIDs(t, k.prepare(t, none), none)
	got = inject(t, e.runtime(t), noneIDs...)
	require.Equal(t, rail0vf1, got.env[envPool])
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
					require.Equal(t, dra.CDIDeviceID(dra.CDIClass, rail0vf0), id, "a normal claim keeps vf=<bdf>")
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

// Two claims of one call for one VF: the claims of a call are checked
// before any is written, and still against each other.
func TestPrepareRefusesOneVFTwiceInOneCall(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	e.start(t)
	k := e.register(t)
	first := e.reserve(t, e.claim(t, "first", vf("vf", rail0vf0)), "pod-a")
	second := e.reserve(t, e.claim(t, "second", vf("vf", rail0vf0), vf("vf2", rail1vf0)), "pod-a")
	resp := k.prepare(t, first, second)
	require.Empty(t, resp[string(first.UID)].Error)
	require.Contains(t, resp[string(second.UID)].Error, "VF 0000:18:00.1 is also allocated to claim default/first (first-uid)")
	require.NoFileExists(t, filepath.Join(e.cdiDir, dra.CDISpecName(second.UID)))
	// The refused claim's VFs are not named in its peer's environment.
	got := inject(t, e.runtime(t), cdiIDs(t, resp, first)...)
	require.Equal(t, rail0vf0, got.env[envPool])
}
