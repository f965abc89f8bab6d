package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/kubeletstub"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

const (
	kubeletDir  = e2eDir + "/device-plugins"
	metricsAddr = "127.0.0.1:8478"
	resNetdev   = "intel.com/igbvf"
	resVFIO     = "intel.com/igb_vfio"
)

// The pools of the serve phase: igbvf VFs, and VFs bound to vfio-pci.
const poolConfig = `{
  "resourceList": [
    {"resourcePrefix": "intel.com", "resourceName": "igbvf",
     "selectors": {"vendors": ["8086"], "devices": ["10ca"], "drivers": ["igbvf"]}},
    {"resourcePrefix": "intel.com", "resourceName": "igb_vfio",
     "selectors": {"vendors": ["8086"], "devices": ["10ca"], "drivers": ["vfio-pci"]}}
  ]
}
`

// served is the plugin under test and the kubelet stand-in's view of it.
type served struct {
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited, waitErr set
	waitErr error
	stub    *kubeletstub.Stub
	// guards the fields below
	mu      sync.Mutex
	devices map[string]map[string]string // resource -> device ID -> health
	clients map[string]pluginapi.DevicePluginClient
	conns   []*grpc.ClientConn
	cancel  context.CancelFunc
}

func (s *served) health(res string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for k, v := range s.devices[res] {
		out[k] = v
	}
	return out
}

func (s *served) stop() {
	if s.cancel != nil {
		s.cancel()
	}
	for _, c := range s.conns {
		_ = c.Close()
	}
	if s.exited != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(20 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	if s.stub != nil {
		s.stub.Stop()
	}
}

// discoverReport is what discover -o json prints (the fields read here).
type discoverReport struct {
	Devices []struct {
		nic.Device
		CharDevices []string `json:"charDevices"`
	} `json:"devices"`
	Pools []struct {
		Resource string   `json:"resource"`
		Devices  []string `json:"devices"`
	} `json:"pools"`
	Warnings []string `json:"warnings"`
}

// serveState is the node the serve phase expects, made by the harness
// (not by provisioning, so that this phase stands on its own): wire A
// with 3 igbvf VFs, wire B with 3, its third bound to vfio-pci.
func (g *guest) serveState() error {
	if err := writePools(); err != nil {
		return err
	}
	if err := setNumVFs(g.wireA.addr, 3); err != nil {
		return err
	}
	if err := setNumVFs(g.wireB.addr, 3); err != nil {
		return err
	}
	return bindVFIO(vfsOf(g.wireB.addr)[2])
}

func serveChecks() []check {
	s := &served{devices: map[string]map[string]string{}, clients: map[string]pluginapi.DevicePluginClient{}}
	return []check{
		{"serve/discover", func(g *guest) error {
			if err := g.needs("setup/pfs"); err != nil {
				return err
			}
			if err := g.serveState(); err != nil {
				return fmt.Errorf("harness: %w", err)
			}
			name, argv := asDaemonSet(baseCaps, "discover", "-o", "json", "--config", filepath.Join(e2eDir, "pools.json"))
			r := run(2*time.Minute, nil, "", name, argv...)
			appendLog("discover.json", r.stdout+r.stderr)
			if r.err != nil {
				return fmt.Errorf("discover: %s", r)
			}
			var rep discoverReport
			if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
				return fmt.Errorf("discover -o json: %w", err)
			}
			byAddr := map[string]nic.Device{}
			for _, d := range rep.Devices {
				byAddr[d.PCIAddress] = d.Device
			}
			var bad []string
			for _, p := range []*pf{g.wireA, g.wireB} {
				d, ok := byAddr[p.addr]
				if !ok {
					bad = append(bad, "PF "+p.String()+" not found")
					continue
				}
				if d.Driver != "igb" || d.Netdev != p.netdev || d.NumVFs != 3 || d.TotalVFs != 7 {
					bad = append(bad, fmt.Sprintf("PF %s: driver %q netdev %q VFs %d/%d", p, d.Driver, d.Netdev, d.NumVFs, d.TotalVFs))
				}
				for i, v := range vfsOf(p.addr) {
					vd, ok := byAddr[v]
					if !ok {
						bad = append(bad, "VF "+v+" not found")
						continue
					}
					want := driverOf(v)
					nd := ""
					if n := netdevsOf(v); len(n) == 1 {
						nd = n[0]
					}
					// the IOMMU group is discovery's for vfio-pci functions only (nic.Device)
					grp := ""
					if want == "vfio-pci" {
						grp = iommuGroup(v)
					}
					if vd.PFAddress != p.addr || vd.VFIndex != i || vd.Driver != want || vd.Netdev != nd || vd.IOMMUGroup != grp {
						bad = append(bad, fmt.Sprintf("VF %s: pf %q index %d driver %q netdev %q iommu %q; the kernel: %s %d %q %q %q",
							v, vd.PFAddress, vd.VFIndex, vd.Driver, vd.Netdev, vd.IOMMUGroup, p.addr, i, want, nd, grp))
					}
					if want == "vfio-pci" && !slices.Contains(vd.VFIODevices, "/dev/vfio/"+iommuGroup(v)) {
						bad = append(bad, fmt.Sprintf("VF %s: vfio devices %v, want /dev/vfio/%s", v, vd.VFIODevices, iommuGroup(v)))
					}
				}
			}
			if len(bad) > 0 {
				return fmt.Errorf("discover on the real sysfs: %s (warnings %v)", strings.Join(bad, "; "), rep.Warnings)
			}
			return nil
		}},
		{"serve/register", func(g *guest) error {
			if err := g.needs("setup/pfs"); err != nil {
				return err
			}
			if err := g.serveState(); err != nil {
				return fmt.Errorf("harness: %w", err)
			}
			if err := os.MkdirAll(kubeletDir, 0o755); err != nil {
				return err
			}
			s.stub = kubeletstub.New(kubeletDir)
			if err := s.stub.Start(); err != nil {
				return err
			}
			logFile, err := os.Create("/tmp/e2e-logs/serve.log")
			if err != nil {
				return err
			}
			name, argv := asDaemonSet(baseCaps, "--config", filepath.Join(e2eDir, "pools.json"), "--kubelet-dir", kubeletDir,
				"--pod-resources-socket", "", "--devinfo-dir", e2eDir+"/devinfo", "--metrics-addr", metricsAddr, "--log-level", "debug")
			s.cmd = exec.Command(name, argv...)
			s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
			if err := s.cmd.Start(); err != nil {
				return err
			}
			s.exited = make(chan struct{})
			go func() { s.waitErr = s.cmd.Wait(); close(s.exited) }()
			ctx, cancel := context.WithCancel(context.Background())
			s.cancel = cancel
			want := []string{resNetdev, resVFIO}
			deadline := time.Now().Add(90 * time.Second)
			for len(s.clients) < len(want) {
				reg, err := s.stub.WaitRegistration(time.Second)
				select {
				case <-s.exited:
					return fmt.Errorf("the plugin exited (%v) before registering %v: %s", s.waitErr, want, tail("/tmp/e2e-logs/serve.log", 3))
				default:
				}
				if err != nil {
					if time.Now().After(deadline) {
						return fmt.Errorf("registered %d of %v: %w: %s", len(s.clients), want, err, tail("/tmp/e2e-logs/serve.log", 3))
					}
					continue
				}
				res := reg.Request.ResourceName
				c, conn, err := s.stub.Dial(reg.Request.Endpoint)
				if err != nil {
					return err
				}
				s.conns = append(s.conns, conn)
				s.clients[res] = c
				stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
				if err != nil {
					return fmt.Errorf("ListAndWatch %s: %w", res, err)
				}
				go func() {
					for {
						r, err := stream.Recv()
						if err != nil {
							return
						}
						m := map[string]string{}
						for _, d := range r.Devices {
							m[d.ID] = d.Health
						}
						s.mu.Lock()
						s.devices[res] = m
						s.mu.Unlock()
					}
				}()
			}
			for _, r := range want {
				if s.clients[r] == nil {
					return fmt.Errorf("no registration of %s (got %v)", r, slices.Collect(maps.Keys(s.clients)))
				}
			}
			// setpriv exec'd the plugin in its own process
			eff, err := capEff(s.cmd.Process.Pid)
			if err != nil {
				return err
			}
			if eff != "0000000000000000" {
				return fmt.Errorf("the serving plugin has CapEff %s, want none (the DaemonSet drops ALL)", eff)
			}
			logf("registered %v with CapEff %s", want, eff)
			return nil
		}},
		{"serve/list-and-watch", func(g *guest) error {
			if err := g.needs("serve/register"); err != nil {
				return err
			}
			wantNet := append(vfsOf(g.wireA.addr), vfsOf(g.wireB.addr)[:2]...)
			wantVFIO := vfsOf(g.wireB.addr)[2:]
			return waitFor(30*time.Second, func() error {
				for res, want := range map[string][]string{resNetdev: wantNet, resVFIO: wantVFIO} {
					h := s.health(res)
					got := slices.Sorted(maps.Keys(h))
					if !slices.Equal(got, slices.Sorted(slices.Values(want))) {
						return fmt.Errorf("%s lists %v, want %v", res, got, want)
					}
					for id, st := range h {
						if st != pluginapi.Healthy {
							return fmt.Errorf("%s: %s is %s", res, id, st)
						}
					}
				}
				return nil
			})
		}},
		{"serve/allocate-vfio", func(g *guest) error {
			if err := g.needs("serve/list-and-watch"); err != nil {
				return err
			}
			vf := vfsOf(g.wireB.addr)[2]
			resp, err := s.clients[resVFIO].Allocate(context.Background(), &pluginapi.AllocateRequest{
				ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{vf}}}})
			if err != nil {
				return fmt.Errorf("Allocate %s: %w", vf, err)
			}
			cr := resp.ContainerResponses[0]
			var paths []string
			for _, d := range cr.Devices {
				paths = append(paths, d.HostPath)
				if _, err := os.Stat(d.HostPath); err != nil {
					return fmt.Errorf("Allocate gave %s: %w", d.HostPath, err)
				}
			}
			logf("Allocate %s: devices %v env %v", vf, paths, cr.Envs)
			grp := "/dev/vfio/" + iommuGroup(vf)
			if !slices.Contains(paths, grp) || !slices.Contains(paths, "/dev/vfio/vfio") {
				return fmt.Errorf("Allocate %s gave devices %v, want %s (its IOMMU group) and /dev/vfio/vfio", vf, paths, grp)
			}
			return nil
		}},
		{"serve/allocate-netdev", func(g *guest) error {
			if err := g.needs("serve/list-and-watch"); err != nil {
				return err
			}
			vf := vfsOf(g.wireA.addr)[0]
			resp, err := s.clients[resNetdev].Allocate(context.Background(), &pluginapi.AllocateRequest{
				ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{vf}}}})
			if err != nil {
				return fmt.Errorf("Allocate %s: %w", vf, err)
			}
			cr := resp.ContainerResponses[0]
			logf("Allocate %s: devices %d env %v", vf, len(cr.Devices), cr.Envs)
			// no RDMA device (igbvf has none): no char devices, no NCCL env
			for _, d := range cr.Devices {
				if strings.HasPrefix(d.HostPath, "/dev/infiniband") {
					return fmt.Errorf("Allocate %s gave %s, and the VF has no RDMA device", vf, d.HostPath)
				}
			}
			if _, ok := cr.Envs["NCCL_IB_HCA"]; ok {
				return fmt.Errorf("Allocate %s set NCCL_IB_HCA=%s for a VF without an RDMA device", vf, cr.Envs["NCCL_IB_HCA"])
			}
			return nil
		}},
		{"serve/pf-carrier-loss", func(g *guest) error {
			if err := g.needs("serve/list-and-watch"); err != nil {
				return err
			}
			if err := ipCmd("link", "set", g.wireA.netdev, "down"); err != nil {
				return err
			}
			t := time.Now()
			err := waitFor(20*time.Second, func() error {
				h := s.health(resNetdev)
				for _, v := range vfsOf(g.wireA.addr) {
					if h[v] != pluginapi.Unhealthy {
						return fmt.Errorf("VF %s of %s (down) is %q", v, g.wireA, h[v])
					}
				}
				for _, v := range vfsOf(g.wireB.addr)[:2] {
					if h[v] != pluginapi.Healthy {
						return fmt.Errorf("VF %s of %s (up) is %q", v, g.wireB, h[v])
					}
				}
				return nil
			})
			logf("PF down -> its VFs Unhealthy in %v", time.Since(t).Round(100*time.Millisecond))
			if e := ipCmd("link", "set", g.wireA.netdev, "up"); e != nil {
				return errors.Join(err, e)
			}
			if err != nil {
				return err
			}
			t = time.Now()
			err = waitFor(30*time.Second, func() error {
				h := s.health(resNetdev)
				for _, v := range vfsOf(g.wireA.addr) {
					if h[v] != pluginapi.Healthy {
						return fmt.Errorf("VF %s of %s (up again) is %q", v, g.wireA, h[v])
					}
				}
				return nil
			})
			logf("PF up -> its VFs Healthy in %v", time.Since(t).Round(100*time.Millisecond))
			return err
		}},
		{"serve/metrics", func(g *guest) error {
			defer s.stop()
			if err := g.needs("serve/register"); err != nil {
				return err
			}
			c := http.Client{Timeout: 20 * time.Second}
			resp, err := c.Get("http://" + metricsAddr + "/metrics")
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("/metrics: %s", resp.Status)
			}
			var found []string
			for _, l := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(l, "fastpath_") && (strings.Contains(l, resNetdev) || strings.Contains(l, "igb")) {
					found = append(found, l)
				}
			}
			if len(found) == 0 {
				return fmt.Errorf("/metrics has no fastpath_ series for the igb pools (%d bytes)", len(b))
			}
			logf("/metrics: %d fastpath_ lines for the igb pools, e.g. %s", len(found), found[0])
			return nil
		}},
	}
}

// tail is the last n lines of a log file, on one line.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// writePools writes the serve phase's pool config (doctor reads it too).
func writePools() error {
	if err := os.MkdirAll(e2eDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(e2eDir, "pools.json"), []byte(poolConfig), 0o644)
}
