package dra_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/dra"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
)

// driverChild is set in the environment of the driver process that
// TestKillDuringPrepare starts (this test binary again): its JSON is a
// childConfig.
const driverChild = "FASTPATH_TEST_DRA_DRIVER"

type childConfig struct {
	Dirs   [4]string // plugin, registry, CDI, device-info
	Claims []*resourceapi.ResourceClaim
	// KillAt is the step boundary ("prepare:cdi") at which the process
	// SIGKILLs itself, "prepare:cdi@2" at its second hit; "" for none.
	KillAt string
	// Ready is created once the driver serves.
	Ready string
}

// TestDriverProcess is the driver process of TestKillDuringPrepare: a real
// driver on the fixture host, its API server a fake holding the claims,
// serving the kubelet over its sockets until it is killed.
func TestDriverProcess(t *testing.T) {
	raw := os.Getenv(driverChild)
	if raw == "" {
		t.Skip("the driver process TestKillDuringPrepare starts")
	}
	var cfg childConfig
	require.NoError(t, json.Unmarshal([]byte(raw), &cfg))
	root := fixtureRoot("dgx-h100")
	e := &testEnv{root: root, pluginDir: cfg.Dirs[0], registryDir: cfg.Dirs[1], cdiDir: cfg.Dirs[2], dev: cfg.Dirs[3],
		client: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-a-uid"}})}
	e.apiServerWrites()
	for _, c := range cfg.Claims {
		_, err := e.client.ResourceV1().ResourceClaims(c.Namespace).Create(context.Background(), c, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	d, err := dra.New(dra.Options{
		NodeName: testNode, KubeClient: e.client, HostRoot: root, NodeRoot: root,
		PluginDir: e.pluginDir, RegistryDir: e.registryDir, CDIDir: e.cdiDir, DevInfoDir: e.dev,
	})
	require.NoError(t, err)
	if cfg.KillAt != "" {
		name, nth := cfg.KillAt, 1
		if n, k, ok := strings.Cut(cfg.KillAt, "@"); ok {
			name = n
			_, err := fmt.Sscan(k, &nth)
			require.NoError(t, err)
		}
		hits := 0
		dra.SetFailpoint(d, func(at string) {
			if at != name {
				return
			}
			if hits++; hits == nth {
				fmt.Fprintf(os.Stderr, "failpoint %s: SIGKILL\n", cfg.KillAt)
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		})
	}
	d.Update(scanWith(t, root, "dra.json"))
	require.NoError(t, d.Start(context.Background()))
	require.NoError(t, os.WriteFile(cfg.Ready, nil, 0o600))
	select {} // until killed
}

// driverProc is a driver process and what it printed.
type driverProc struct {
	cmd  *exec.Cmd
	out  *testbin.Output
	done chan struct{} // closed when it has ended, with err
	err  error
}

// startDriver runs TestDriverProcess on the env's directories and waits
// until it serves.
func startDriver(t *testing.T, e *testEnv, claims []*resourceapi.ResourceClaim, killAt string) *driverProc {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	raw, err := json.Marshal(childConfig{Dirs: [4]string{e.pluginDir, e.registryDir, e.cdiDir, e.dev}, Claims: claims, KillAt: killAt, Ready: ready})
	require.NoError(t, err)
	p := &driverProc{cmd: exec.Command(os.Args[0], "-test.run", "^TestDriverProcess$", "-test.count", "1"), out: &testbin.Output{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), driverChild+"="+string(raw))
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	require.NoError(t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	deadline := time.After(20 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("driver process ended (%v) before it served:\n%s", p.err, p.out)
		case <-deadline:
			t.Fatalf("driver process not serving within 20 s:\n%s", p.out)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// killedAt waits for the process to have SIGKILLed itself at its failpoint.
func (p *driverProc) killedAt(t *testing.T, point string) {
	t.Helper()
	<-p.done
	err := p.err
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "driver process: %v\n%s", err, p.out)
	ws, _ := exit.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "driver process ended with %v, not SIGKILL:\n%s", err, p.out)
	require.Contains(t, p.out.String(), "failpoint "+point+": SIGKILL", "the process died, but not at its failpoint")
}

// shortEnv is newTestEnv's directories under a short path: a unix
// socket's path has at most 107 bytes, and a subtest's TempDir is named
// after it.
func shortEnv(t *testing.T) *testEnv {
	t.Helper()
	base, err := os.MkdirTemp("", "dra-kill-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	e := &testEnv{pluginDir: filepath.Join(base, "plugin"), registryDir: filepath.Join(base, "registry"),
		cdiDir: filepath.Join(base, "cdi"), dev: filepath.Join(base, "devinfo")}
	for _, d := range []string{e.pluginDir, e.registryDir} {
		require.NoError(t, os.MkdirAll(d, 0o750))
	}
	return e
}

// files are the regular files under dir, by path relative to it, with
// their content; temporaries and staging directories included.
func files(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Type()&os.ModeSocket != 0 {
			return err
		}
		data, err := os.ReadFile(path)
		rel, _ := filepath.Rel(dir, path)
		out[rel] = string(data)
		return err
	})
	if !errors.Is(err, os.ErrNotExist) {
		require.NoError(t, err)
	}
	return out
}

// checkpointClaims are the claims the checkpoint holds, by UID, with the
// PCI addresses of their VFs.
func checkpointClaims(t *testing.T, e *testEnv) map[string][]string {
	t.Helper()
	var cp struct {
		Claims map[string]struct {
			Devices []struct{ PCIAddress string }
		}
	}
	data, err := os.ReadFile(filepath.Join(e.pluginDir, dra.CheckpointFile))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &cp))
	out := map[string][]string{}
	for uid, c := range cp.Claims {
		for _, d := range c.Devices {
			out[uid] = append(out[uid], d.PCIAddress)
		}
	}
	return out
}

// The driver process SIGKILLed at every step boundary of a Prepare of a
// pod's two claims (after the checkpoint's journal entry of the first and
// of the second claim, after each CDI spec, after each device-info file,
// before its answer), then started again. The kubelet, which got no
// answer, either prepares the same claims again — they get the same VFs
// under the same CDI names, the files are those of a Prepare never
// interrupted, a third claim allocated one of those VFs is refused — or,
// the pod deleted meanwhile, unprepares them: nothing is left. In both
// cases no temporary or staging file remains and the checkpoint holds
// exactly the claims still prepared.
func TestKillDuringPrepare(t *testing.T) {
	points := []string{"", "prepare:journal", "prepare:cdi", "prepare:devinfo", "prepare:journal@2",
		"prepare:cdi@2", "prepare:devinfo@2", "prepare:answer"}
	mkClaim := func(name, addr string) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: k8stypes.UID("uid-" + name)},
			Status: resourceapi.ResourceClaimStatus{
				Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
					{Driver: dra.DriverName, Request: "vf", Pool: testNode, Device: dra.DeviceName(addr)}}}},
				ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "rank-0", UID: "pod-0"}},
			},
		}
		return c
	}
	a, b := mkClaim("rank-0-rail0", rail0vf0), mkClaim("rank-0-rail1", rail1vf0)
	late := mkClaim("late", rail0vf0)
	late.Status.ReservedFor[0].UID = "pod-1"
	claims := []*resourceapi.ResourceClaim{a, b, late}
	wantIDs := []string{dra.CDIDeviceID(dra.CDIClass, rail0vf0), dra.CDIDeviceID(dra.CDIClass, rail1vf0)}

	var refCDI, refInfo map[string]string // the files of a Prepare never interrupted
	for _, point := range points {
		for _, then := range []string{"prepare again", "unprepare"} {
			t.Run(fmt.Sprintf("killed at %q, %s", point, then), func(t *testing.T) {
				if point == "" && then == "unprepare" {
					t.Skip("nothing to unprepare after: covered by the prepared claims' Unprepare")
				}
				e := shortEnv(t)
				p := startDriver(t, e, claims, point)
				k := e.register(t)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				req := &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{
					{Namespace: "default", Name: a.Name, Uid: string(a.UID)}, {Namespace: "default", Name: b.Name, Uid: string(b.UID)}}}
				_, err := k.dra.NodePrepareResources(ctx, req)
				if point == "" {
					require.NoError(t, err)
				} else {
					require.Error(t, err, "the kubelet gets no answer from a killed driver")
					p.killedAt(t, point)
				}

				startDriver(t, e, claims, "")
				k = e.register(t)
				switch then {
				case "prepare again":
					resp := k.prepare(t, a, b)
					require.Equal(t, wantIDs, cdiIDs(t, resp, a, b))
					// The helper's metadata specs name this run's plugin
					// directory: compared by name, the driver's by content.
					cdiFiles, infoFiles := files(t, e.cdiDir), files(t, e.dev)
					require.ElementsMatch(t, []string{metaSpecName(a), metaSpecName(b)}, slices.Collect(maps.Keys(metadataOnly(cdiFiles))))
					maps.DeleteFunc(cdiFiles, func(name, _ string) bool { return isMetaSpec(name) })
					if refCDI == nil {
						refCDI, refInfo = cdiFiles, infoFiles
						require.Len(t, refCDI, 2)
						require.Len(t, refInfo, 2)
					}
					require.Equal(t, refCDI, cdiFiles, "CDI specs")
					require.Equal(t, refInfo, infoFiles, "device-info files")
					require.Equal(t, map[string][]string{string(a.UID): {rail0vf0}, string(b.UID): {rail1vf0}}, checkpointClaims(t, e))
					require.Contains(t, k.prepare(t, late)[string(late.UID)].Error, "already prepared for claim default/"+a.Name)
				case "unprepare":
					for uid, err := range k.unprepare(t, a, b) {
						require.Empty(t, err.Error, uid)
					}
					require.Empty(t, files(t, e.cdiDir), "CDI directory")
					require.Empty(t, files(t, e.dev), "device-info directory")
					require.Empty(t, checkpointClaims(t, e))
					require.Empty(t, k.prepare(t, late)[string(late.UID)].Error, "the VF is free again")
				}
				// The plugin directory holds the checkpoint, and the
				// metadata files and kept metadata specs of the claims
				// prepared now: nothing of a claim unprepared.
				prepared := []*resourceapi.ResourceClaim{a, b}
				if then == "unprepare" {
					prepared = []*resourceapi.ResourceClaim{late}
				}
				want := []string{dra.CheckpointFile}
				for _, c := range prepared {
					want = append(want, "dra-device-metadata/default_"+c.Name+"/vf/metadata.json", "metadata-cdi-specs/"+metaSpecName(c))
				}
				require.ElementsMatch(t, want, slices.Collect(maps.Keys(files(t, e.pluginDir))), "plugin directory")
			})
		}
	}
}

// metaSpecName is the helper's device metadata CDI spec of a claim's
// request "vf".
func metaSpecName(c *resourceapi.ResourceClaim) string {
	return dra.DriverName + "_metadata_" + string(c.UID) + "_vf.json"
}

func isMetaSpec(name string) bool { return strings.HasPrefix(name, dra.DriverName+"_metadata_") }

// metadataOnly are the helper's metadata specs among CDI files.
func metadataOnly(files map[string]string) map[string]string {
	out := maps.Clone(files)
	maps.DeleteFunc(out, func(name, _ string) bool { return !isMetaSpec(name) })
	return out
}
