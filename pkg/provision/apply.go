package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fastpath-k8s/fastpath/internal/atomicfile"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
)

// Kernel is every write provisioning makes, one method per step. The
// real one (NewSysfsKernel) writes sysfs under a host root and sets GUIDs
// through the PF's netlink; tests use provisiontest's fake, which lays
// out what the kernel would.
type Kernel interface {
	// SetNumVFs writes n to the PF's sriov_numvfs.
	SetNumVFs(pf string, n int) error
	// SetAutoprobe writes the PF's sriov_drivers_autoprobe.
	SetAutoprobe(pf string, on bool) error
	// SetVFGUID sets the node and port GUID of VF vf of the PF, whose
	// netdev is pfNetdev, while the VF is unbound.
	SetVFGUID(pf, pfNetdev string, vf int, guid net.HardwareAddr) error
	// Unbind unbinds a function from its driver.
	Unbind(addr string) error
	// Bind binds a function to driver through driver_override and
	// drivers_probe; DriverByID clears the override, and the PCI core
	// then probes the VF for the driver its IDs match only while its
	// PF's sriov_drivers_autoprobe is 1 (the plan's steps see to that).
	Bind(addr, driver string) error
	// SetMTU sets a netdev's MTU.
	SetMTU(netdev string, mtu int) error
}

// Record is the write-ahead record of a PF being changed, written to the
// state directory before the first write and removed after the last: a
// record found at start says a run stopped half way, and which PF the
// next plan repairs.
type Record struct {
	PF      string    `json:"pf"`
	Policy  string    `json:"policy"`
	From    int       `json:"from"`
	Want    int       `json:"want"`
	Started time.Time `json:"started"`
	// Done is how many of the plan's steps had run when last written.
	Done  int      `json:"done"`
	Steps []string `json:"steps"`
	// Autoprobe is the PF's sriov_drivers_autoprobe before the run
	// changed it, which a run that resumes leaves it with (the steps set
	// it to 0 and 1 on the way).
	Autoprobe *bool `json:"autoprobe,omitempty"`
}

// DefaultStateDir is where the records go on a node.
const DefaultStateDir = "/var/lib/fastpath/provision"

// Found is what a PF had when provisioning first changed it, kept in the
// state directory's found/ as <pci>.json so that an uninstall
// (`rdma-device-plugin uninstall`) can return the PF to it. It is written
// before the first write to the PF and never overwritten: a later start,
// which finds fastpath's own VFs there, keeps the first one's. Only PFs
// whose steps ran have one (an externally managed PF has none).
type Found struct {
	PF     string `json:"pf"`
	Netdev string `json:"netdev,omitempty"`
	// NumVFs is the PF's sriov_numvfs, Autoprobe its
	// sriov_drivers_autoprobe, as found.
	NumVFs    int       `json:"numVfs"`
	Autoprobe bool      `json:"autoprobe"`
	Policy    string    `json:"policy"` // the policy that first changed it
	Recorded  time.Time `json:"recorded"`
}

// FoundDir is where the Found records are kept under a state directory.
func FoundDir(stateDir string) string { return filepath.Join(stateDir, "found") }

// LoadFound reads the Found records under stateDir, by PF; a missing
// directory has none. A record that does not decode is an error: its PF's
// count would be a guess.
func LoadFound(stateDir string) (map[string]Found, error) {
	out := map[string]Found{}
	ok, err := readPFFiles(FoundDir(stateDir), func(addr, path string, b []byte) error {
		var f Found
		if err := json.Unmarshal(b, &f); err != nil || f.PF != addr {
			return fmt.Errorf("provision state %s: not a record of what PF %s had (%v): read it, set the PF's sriov_numvfs yourself, and remove the file", path, addr, err)
		}
		out[addr] = f
		return nil
	})
	if !ok || err != nil {
		return nil, err
	}
	return out, nil
}

// RemoveFound removes the Found record of pf, once the PF is back to it.
func RemoveFound(stateDir, pf string) error {
	if err := os.Remove(filepath.Join(FoundDir(stateDir), pf+".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("pci %s: remove the record of what it had: %w", pf, err)
	}
	return nil
}

// LoadRecords reads the records in dir; a missing dir has none.
func LoadRecords(dir string) (map[string]Record, error) {
	out := map[string]Record{}
	ok, err := readPFFiles(dir, func(addr, _ string, b []byte) error {
		var r Record
		if err := json.Unmarshal(b, &r); err != nil || r.PF != addr {
			// A torn record still names its PF by file name.
			r = Record{PF: addr}
		}
		out[addr] = r
		return nil
	})
	if !ok || err != nil {
		return nil, err
	}
	return out, nil
}

// readPFFiles hands each regular file <pci address>.json in dir, its path
// and its bytes to each (LoadRecords, LoadFound); other names are skipped.
// A missing dir has none: false.
func readPFFiles(dir string, each func(addr, path string, b []byte) error) (bool, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("provision state %s: %w", dir, err)
	}
	for _, e := range ents {
		addr, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !pci.ValidAddress(addr) || !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			return true, fmt.Errorf("provision state %s: %w", e.Name(), err)
		}
		if err := each(addr, path, b); err != nil {
			return true, err
		}
	}
	return true, nil
}

// Applier carries plans out.
type Applier struct {
	Kernel Kernel
	// Root is the host root the waits read sysfs under.
	Root string
	// StateDir holds the write-ahead records; "" keeps none.
	StateDir string
	// Timeout bounds the wait for one PF's VFs to show their netdevs and
	// RDMA devices after they are bound (DefaultTimeout when 0).
	Timeout time.Duration
	// Poll is how often a wait looks (DefaultPoll when 0).
	Poll time.Duration
	Log  *slog.Logger
}

// Defaults of an Applier.
const (
	DefaultTimeout = 60 * time.Second
	DefaultPoll    = 20 * time.Millisecond
)

// ErrTimeout: a VF did not show what it waits for in time.
var ErrTimeout = errors.New("timed out")

// Result is what an Apply did.
type Result struct {
	Changed  []string // PFs whose steps ran to the end
	Repaired []string // PFs a record said were left half way
	// Errors are the PFs whose steps failed, by address.
	Errors map[string]error
	// PerPF is how long each changed PF took.
	PerPF map[string]time.Duration
}

// Apply runs the plan's steps, one PF after the other; a PF whose steps
// fail keeps its record for the next run and the others go on. It
// returns the joined failures.
func (a *Applier) Apply(ctx context.Context, plan *Plan) (Result, error) {
	res := Result{Errors: map[string]error{}, PerPF: map[string]time.Duration{}}
	records, err := LoadRecords(a.StateDir)
	if err != nil {
		return res, err
	}
	var errs []error
	for i := range plan.PFs {
		pf := &plan.PFs[i]
		if _, ok := records[pf.Address]; ok {
			res.Repaired = append(res.Repaired, pf.Address)
		}
		if len(pf.Steps) == 0 {
			if _, ok := records[pf.Address]; ok && pf.Refused == nil {
				if err := a.removeRecord(pf.Address); err != nil {
					errs = append(errs, err)
				}
			}
			continue
		}
		start := time.Now()
		if err := a.applyPF(ctx, pf); err != nil {
			res.Errors[pf.Address] = err
			errs = append(errs, err)
			continue
		}
		res.Changed = append(res.Changed, pf.Address)
		res.PerPF[pf.Address] = time.Since(start)
	}
	return res, errors.Join(errs...)
}

func (a *Applier) log() *slog.Logger {
	if a.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return a.Log
}

func (a *Applier) recordPath(pf string) string { return filepath.Join(a.StateDir, pf+".json") }

func (a *Applier) writeRecord(r *Record) error {
	if a.StateDir == "" {
		return nil
	}
	if err := os.MkdirAll(a.StateDir, 0o700); err != nil {
		return fmt.Errorf("provision state %s: %w", a.StateDir, err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(a.recordPath(r.PF), b, 0o600); err != nil {
		return fmt.Errorf("pci %s: write provisioning record: %w", r.PF, err)
	}
	return nil
}

func (a *Applier) removeRecord(pf string) error {
	if a.StateDir == "" {
		return nil
	}
	if err := os.Remove(a.recordPath(pf)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("pci %s: remove provisioning record: %w", pf, err)
	}
	return nil
}

// keepFound writes the Found record of pf unless it has one.
func (a *Applier) keepFound(pf *PF) error {
	if a.StateDir == "" {
		return nil
	}
	path := filepath.Join(FoundDir(a.StateDir), pf.Address+".json")
	if _, err := os.Lstat(path); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("pci %s: the record of what it had: %w", pf.Address, err)
	}
	if err := os.MkdirAll(FoundDir(a.StateDir), 0o700); err != nil {
		return fmt.Errorf("provision state %s: %w", a.StateDir, err)
	}
	b, err := json.Marshal(Found{PF: pf.Address, Netdev: pf.Netdev, NumVFs: pf.NumVFs, Autoprobe: pf.Autoprobe, Policy: pf.Policy, Recorded: time.Now().UTC()})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, b, 0o600); err != nil {
		return fmt.Errorf("pci %s: write the record of what it had: %w", pf.Address, err)
	}
	return nil
}

func (a *Applier) applyPF(ctx context.Context, pf *PF) error {
	if err := a.keepFound(pf); err != nil {
		return err
	}
	rec := &Record{PF: pf.Address, Policy: pf.Policy, From: pf.NumVFs, Want: pf.Want, Started: time.Now().UTC(), Autoprobe: &pf.Autoprobe}
	for _, s := range pf.Steps {
		rec.Steps = append(rec.Steps, s.String())
	}
	if err := a.writeRecord(rec); err != nil {
		return err
	}
	a.log().Info("provisioning PF", "pf", pf.Address, "netdev", pf.Netdev, "policy", pf.Policy, "numVfs", pf.NumVFs, "want", pf.Want, "steps", len(pf.Steps))
	deadline := time.Now().Add(a.timeout())
	for i, s := range pf.Steps {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("pci %s: %w", pf.Address, err)
		}
		if err := a.step(ctx, pf, s, deadline); err != nil {
			return fmt.Errorf("pci %s: step %d (%s): %w", pf.Address, i+1, s, err)
		}
		if s.Kind == StepNumVFs {
			if err := a.waitBus(ctx, pf.Address, s.N, deadline); err != nil {
				return fmt.Errorf("pci %s: step %d (%s): %w", pf.Address, i+1, s, err)
			}
		}
		// The record is rewritten at the steps that change the VF count,
		// where a later run's plan differs most from this one.
		if s.Kind == StepNumVFs {
			rec.Done = i + 1
			if err := a.writeRecord(rec); err != nil {
				return err
			}
		}
	}
	return a.removeRecord(pf.Address)
}

func (a *Applier) timeout() time.Duration {
	if a.Timeout > 0 {
		return a.Timeout
	}
	return DefaultTimeout
}

func (a *Applier) poll() time.Duration {
	if a.Poll > 0 {
		return a.Poll
	}
	return DefaultPoll
}

// vfAddress reads the address of VF k of pf from its virtfnN link.
func (a *Applier) vfAddress(pf string, k int) (string, error) {
	l, err := os.Readlink(filepath.Join(a.Root, "sys", "bus", "pci", "devices", pf, fmt.Sprintf("virtfn%d", k)))
	if err != nil {
		return "", fmt.Errorf("VF %d: %w", k, err)
	}
	addr := filepath.Base(l)
	if !pci.ValidAddress(addr) {
		return "", fmt.Errorf("VF %d: virtfn%d -> %q is not a PCI function", k, k, l)
	}
	return addr, nil
}

func (a *Applier) step(ctx context.Context, pf *PF, s Step, deadline time.Time) error {
	switch s.Kind {
	case StepMTU:
		return a.Kernel.SetMTU(pf.Netdev, s.N)
	case StepAutoprobe:
		return a.Kernel.SetAutoprobe(pf.Address, s.N != 0)
	case StepNumVFs:
		return a.Kernel.SetNumVFs(pf.Address, s.N)
	case StepGUID:
		return a.Kernel.SetVFGUID(pf.Address, pf.Netdev, s.VF, s.GUID)
	}
	addr, err := a.vfAddress(pf.Address, s.VF)
	if err != nil {
		return err
	}
	switch s.Kind {
	case StepUnbind:
		return a.Kernel.Unbind(addr)
	case StepBind:
		return a.Kernel.Bind(addr, s.Drv)
	case StepWait:
		return a.wait(ctx, addr, s, deadline)
	}
	return fmt.Errorf("unknown step %q", s.Kind)
}

// waitBus waits until the PF's virtfnN links show n VFs. The kernel adds
// them before the sriov_numvfs write returns, so on a node this is one
// look; it makes the next steps, which find VFs through those links, safe
// on anything that plays the kernel more slowly.
func (a *Applier) waitBus(ctx context.Context, pf string, n int, deadline time.Time) error {
	t := time.NewTicker(a.poll())
	defer t.Stop()
	for {
		links, _ := filepath.Glob(filepath.Join(a.Root, "sys", "bus", "pci", "devices", pf, "virtfn*"))
		if len(links) == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %s waiting for the PCI core to show %d VFs (it shows %d)", ErrTimeout, a.timeout(), n, len(links))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// wait polls the VF's sysfs directory until it has what s waits for.
func (a *Applier) wait(ctx context.Context, addr string, s Step, deadline time.Time) error {
	dir := filepath.Join(a.Root, "sys", "bus", "pci", "devices", addr)
	has := func(sub string) bool {
		ents, err := os.ReadDir(filepath.Join(dir, sub))
		return err == nil && len(ents) > 0
	}
	ready := func() (bool, string) {
		l, err := os.Readlink(filepath.Join(dir, "driver"))
		bound := "not bound to any driver: is the driver its IDs match loaded?"
		if err == nil {
			bound = "bound to " + filepath.Base(l)
		}
		switch s.Drv {
		case DriverVFIO:
			return err == nil && filepath.Base(l) == DriverVFIO, "bound to vfio-pci (it is " + bound + ")"
		case "netdev+rdma":
			return has("net") && has("infiniband"), "a netdev and an RDMA device (it is " + bound + "; is its RDMA driver loaded?)"
		}
		return has("net"), "a netdev (it is " + bound + ")"
	}
	t := time.NewTicker(a.poll())
	defer t.Stop()
	for {
		ok, what := ready()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("VF %d (%s) %w after %s waiting for %s", s.VF, addr, ErrTimeout, a.timeout(), what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
