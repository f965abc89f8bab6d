package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/fastpath-k8s/fastpath/internal/words"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// The probes' reasons, as sentinels a probe's error wraps: /healthz and
// /readyz answer with the reason's code only (ProbeReason), the detail goes
// to the log (issue 44, finding 7).
var (
	ErrStarting      = errors.New("starting")
	ErrNotRegistered = errors.New("not registered with the kubelet")
	ErrDevNodes      = errors.New("RDMA char devices missing from /dev")
)

// ProbeReason is the short code a probe answers for err: no error text, no
// path, nothing about the node beyond which check failed.
func ProbeReason(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrStarting):
		return "starting"
	case errors.Is(err, ErrNotRegistered):
		return "not-registered"
	case errors.Is(err, ErrDevNodes):
		return "dev-stale"
	}
	return "failed"
}

// probeStatus is what the probes report, published by the Run goroutine.
type probeStatus struct {
	mu         sync.Mutex // guards the fields below
	started    bool       // the first scan is applied
	settled    bool       // and what a start puts off after registration is done
	served     int        // pools served to the kubelet
	registered int        // of those, registered with the current kubelet
}

func (m *Manager) publish() {
	m.status.mu.Lock()
	defer m.status.mu.Unlock()
	m.status.started = true
	m.status.served = len(m.servers)
	m.status.registered = len(m.registered)
}

func (m *Manager) settle() {
	m.status.mu.Lock()
	defer m.status.mu.Unlock()
	m.status.settled = true
}

func (m *Manager) counts() (started bool, served, registered int) {
	m.status.mu.Lock()
	defer m.status.mu.Unlock()
	return m.status.started, m.status.served, m.status.registered
}

// Ready is the readiness check: nil once every pool the Manager serves is
// registered with the kubelet and what a start puts off until then (CDI
// specs) is done. Safe to call from any goroutine.
func (m *Manager) Ready() error {
	started, served, registered := m.counts()
	m.status.mu.Lock()
	settled := m.status.settled
	m.status.mu.Unlock()
	switch {
	case !started || !settled:
		return ErrStarting
	case registered < served:
		return fmt.Errorf("%d of %d pools registered with the kubelet: %w", registered, served, ErrNotRegistered)
	}
	return nil
}

// Healthy is the liveness check, for a probe that restarts the plugin when
// it fails: an error when the Manager serves pools but none is registered
// with the kubelet, or when the host's sysfs lists RDMA char devices that
// the plugin's view of /dev does not have (a /dev mount that is not the
// host's, or one left stale by a driver reload: every Allocate would hand
// out devices NCCL cannot open). Safe to call from any goroutine.
func (m *Manager) Healthy() error {
	started, served, registered := m.counts()
	if !started {
		return ErrStarting
	}
	if served > 0 && registered == 0 {
		return fmt.Errorf("none of %d pools is registered with the kubelet (%s): %w", served, m.kubeletSock(), ErrNotRegistered)
	}
	return checkDevNodes(m.opts.HostRoot)
}

// charClasses are the sysfs classes of the RDMA char devices.
var charClasses = []string{"infiniband_verbs", "infiniband_mad"}

// checkDevNodes compares the RDMA char devices sysfs lists under root
// (uverbsN, umadN, issmN) with the names under <root>/dev/infiniband. Only
// names are compared: a node's major:minor is the kernel's business, and
// test hosts stand in /dev/null-like nodes for them.
func checkDevNodes(root string) error {
	nodes, err := rdma.NewReader(root).DevNodes()
	if err != nil {
		return fmt.Errorf("list %s: %w", filepath.Join(root, rdma.DevDir), err)
	}
	var missing []string
	for _, class := range charClasses {
		dir := filepath.Join(root, "sys", "class", class)
		ents, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue // the module is not loaded: nothing to have
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", dir, err)
		}
		for _, e := range ents {
			name := e.Name()
			if _, ok := rdma.CharKind(name); !ok {
				continue // abi_version
			}
			if !nodes.Has(rdma.DevDir + "/" + name) {
				missing = append(missing, name)
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	return fmt.Errorf("sysfs lists RDMA char devices that %s does not have: %s (is the node's /dev mounted, and is it the live one after a driver reload?): %w",
		filepath.Join(root, rdma.DevDir), words.List(missing, 5), ErrDevNodes)
}
