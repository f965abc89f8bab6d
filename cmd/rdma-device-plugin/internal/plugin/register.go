package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// KubeletSocket is the kubelet's registration socket in the device plugin
// directory.
const KubeletSocket = "kubelet.sock"

func (m *Manager) kubeletSock() string { return filepath.Join(m.opts.KubeletDir, KubeletSocket) }

// fileID identifies a file across removal and recreation.
type fileID struct {
	dev, ino uint64
	ctime    int64
}

func statID(path string) (fileID, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fileID{}, err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, fmt.Errorf("stat %s: no inode", path)
	}
	return fileID{dev: uint64(sys.Dev), ino: sys.Ino, ctime: sys.Ctim.Nano()}, nil
}

// reconcile makes the servers match the kubelet: without kubelet.sock they
// are stopped; when kubelet.sock is a new file (inode and ctime), all are
// restarted and registered; a server whose socket is missing is restarted
// and registered. It reports whether every server is registered (false
// schedules a retry).
func (m *Manager) reconcile(ctx context.Context) bool {
	ok := m.reconcileOnce(ctx)
	m.publish()
	return ok
}

func (m *Manager) reconcileOnce(ctx context.Context) bool {
	id, err := statID(m.kubeletSock())
	if err != nil {
		switch {
		case m.kubelet != (fileID{}) || len(m.registered) > 0:
			m.log.Info("kubelet socket gone; waiting for the kubelet", "socket", m.kubeletSock())
		case m.waitingSince.IsZero():
			m.log.Warn("waiting for the kubelet: no kubelet.sock yet, so no pool is registered; if the kubelet runs, its device-plugins directory is elsewhere (--kubelet-dir, and the DaemonSet's hostPath)",
				"socket", m.kubeletSock())
		}
		if m.waitingSince.IsZero() {
			m.waitingSince = time.Now()
		}
		for _, s := range m.servers {
			s.stop()
		}
		m.kubelet = fileID{}
		clear(m.registered)
		return true // the Create event of kubelet.sock wakes us
	}
	m.waitingSince = time.Time{}
	restartAll := id != m.kubelet || m.kubeletGone
	m.kubeletGone = false
	if restartAll && m.kubelet != (fileID{}) {
		m.log.Info("kubelet restarted; re-registering", "socket", m.kubeletSock())
	}
	m.kubelet = id
	var todo []string
	for r, s := range m.servers {
		p := m.pools[r]
		sock := filepath.Join(m.opts.KubeletDir, SocketName(p.Prefix, p.Name))
		_, serr := os.Lstat(sock)
		switch {
		case restartAll, s.socket() == "", errors.Is(serr, fs.ErrNotExist):
			if s.socket() != "" && !restartAll {
				m.log.Info("our socket was removed; restarting", "resource", r, "socket", sock)
			}
			s.stop()
			delete(m.registered, r)
			if err := s.start(sock); err != nil {
				m.log.Error("start device plugin server", "resource", r, "err", err)
				continue
			}
			todo = append(todo, r)
		case !m.registered[r]:
			todo = append(todo, r)
		}
	}
	if len(todo) == 0 {
		return len(m.registered) == len(m.servers)
	}
	sort.Strings(todo)
	conn, err := grpc.NewClient("unix://"+m.kubeletSock(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		m.log.Error("connect to kubelet", "socket", m.kubeletSock(), "err", err)
		return false
	}
	defer conn.Close()
	client := pluginapi.NewRegistrationClient(conn)
	// The pools register at once: each Register is a round trip to the
	// kubelet, and a start waits for the last.
	errs := make([]error, len(todo))
	var wg sync.WaitGroup
	for i, r := range todo {
		p := m.pools[r]
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, m.opts.RegisterTimeout)
			defer cancel()
			_, errs[i] = client.Register(rctx, &pluginapi.RegisterRequest{
				Version:      pluginapi.Version,
				Endpoint:     SocketName(p.Prefix, p.Name),
				ResourceName: r,
				Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
			})
		})
	}
	wg.Wait()
	ok := true
	for i, r := range todo {
		p, err := m.pools[r], errs[i]
		m.opts.Metrics.registered(r, err)
		if err != nil {
			m.log.Warn("register with kubelet failed; will retry", "resource", r, "err", err)
			ok = false
			continue
		}
		// The kubelet empties the directory when it starts: if that
		// happened between our check and the call, the registration
		// names a socket that is gone. Retry; the Remove event restarts
		// the server.
		if _, err := os.Lstat(filepath.Join(m.opts.KubeletDir, SocketName(p.Prefix, p.Name))); err != nil {
			m.log.Info("socket removed while registering; will retry", "resource", r)
			ok = false
			continue
		}
		m.registered[r] = true
		m.log.Info("registered with kubelet", "resource", r, "socket", SocketName(p.Prefix, p.Name))
	}
	return ok && len(m.registered) == len(m.servers)
}
