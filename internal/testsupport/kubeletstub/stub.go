// Package kubeletstub is a stand-in for the kubelet's device manager in
// tests: the Registration service on <dir>/kubelet.sock, a restart that
// empties the directory like the kubelet does, and a client for the
// plugins that registered.
package kubeletstub

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Registration is one Register call.
type Registration struct {
	Request *pluginapi.RegisterRequest
	At      time.Time
	// Generation counts the stub's starts: the registration reached the
	// kubelet.sock of that start, so a test can tell a stale retry to a
	// previous "kubelet" from a re-registration.
	Generation int
}

// Stub serves the Registration service.
type Stub struct {
	Dir string
	// Registrations receives every Register call (buffered; a test that
	// does not read it only loses old entries, never blocks the plugin).
	Registrations chan Registration
	// Validate, when set, is called on each request; an error is returned
	// to the plugin (registration refused).
	Validate func(*pluginapi.RegisterRequest) error

	mu   sync.Mutex // guards the fields below
	srv  *grpc.Server
	done chan struct{}
	gen  int
	// listening is when the current kubelet.sock was created.
	listening time.Time
}

// generation serves one start of the stub.
type generation struct {
	pluginapi.UnimplementedRegistrationServer
	stub *Stub
	n    int
}

func (g *generation) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	return g.stub.register(ctx, g.n, req)
}

// Generation is the number of the current (last) start.
func (s *Stub) Generation() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// Listening is when the current (last) start created kubelet.sock: the
// moment a plugin can first see it.
func (s *Stub) Listening() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listening
}

// New returns a stub for dir; call Start.
func New(dir string) *Stub {
	return &Stub{Dir: dir, Registrations: make(chan Registration, 1024)}
}

// Socket is <dir>/kubelet.sock.
func (s *Stub) Socket() string { return filepath.Join(s.Dir, "kubelet.sock") }

// Start listens on kubelet.sock.
func (s *Stub) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return errors.New("kubeletstub: already started")
	}
	if err := os.Remove(s.Socket()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("kubeletstub: remove %s: %w", s.Socket(), err)
	}
	l, err := net.Listen("unix", s.Socket())
	if err != nil {
		return fmt.Errorf("kubeletstub: listen %s: %w", s.Socket(), err)
	}
	s.listening = time.Now()
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	g := grpc.NewServer()
	s.gen++
	pluginapi.RegisterRegistrationServer(g, &generation{stub: s, n: s.gen})
	done := make(chan struct{})
	s.srv, s.done = g, done
	go func() {
		defer close(done)
		_ = g.Serve(l)
	}()
	return nil
}

// Stop stops serving and removes kubelet.sock.
func (s *Stub) Stop() {
	s.mu.Lock()
	g, done := s.srv, s.done
	s.srv, s.done = nil, nil
	s.mu.Unlock()
	if g == nil {
		return
	}
	g.Stop()
	<-done
	_ = os.Remove(s.Socket())
}

// Restart does what a restarting kubelet does to the directory: stop,
// remove every socket in it (the plugins' too), then serve a new
// kubelet.sock.
func (s *Stub) Restart() error {
	s.Stop()
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		return fmt.Errorf("kubeletstub: list %s: %w", s.Dir, err)
	}
	for _, e := range entries {
		if e.Type()&fs.ModeSocket != 0 {
			if err := os.Remove(filepath.Join(s.Dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("kubeletstub: remove %s: %w", e.Name(), err)
			}
		}
	}
	return s.Start()
}

// register records the request.
func (s *Stub) register(_ context.Context, gen int, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if s.Validate != nil {
		if err := s.Validate(req); err != nil {
			return nil, err
		}
	}
	select {
	case s.Registrations <- Registration{Request: req, At: time.Now(), Generation: gen}:
	default:
	}
	return &pluginapi.Empty{}, nil
}

// WaitRegistration returns the next registration, or an error after timeout.
func (s *Stub) WaitRegistration(timeout time.Duration) (Registration, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-s.Registrations:
		return r, nil
	case <-t.C:
		return Registration{}, fmt.Errorf("kubeletstub: no registration within %v", timeout)
	}
}

// Dial connects to a plugin's endpoint (a socket name in Dir), as the
// kubelet does after Register.
func (s *Stub) Dial(endpoint string) (pluginapi.DevicePluginClient, *grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(s.Dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("kubeletstub: dial %s: %w", endpoint, err)
	}
	return pluginapi.NewDevicePluginClient(conn), conn, nil
}
