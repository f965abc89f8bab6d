package plugin

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

// fakeRDMA keeps which netns (by inode) each RDMA device is in; devices it
// never moved are in the netns of the test process.
type fakeRDMA struct {
	mu       sync.Mutex // guards the fields below
	mode     string
	modeErr  error
	host     string
	where    map[string]string
	moves    []string
	failMove error
}

var _ RDMA = (*fakeRDMA)(nil)

func newFakeRDMA(mode string) *fakeRDMA {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		panic(err)
	}
	return &fakeRDMA{mode: mode, host: fmt.Sprint(st.Ino), where: map[string]string{}}
}

// nsID names a netns by its inode.
func nsID(n *netns.NS) string {
	var st unix.Stat_t
	if err := unix.Fstat(n.Fd(), &st); err != nil {
		return "?"
	}
	return fmt.Sprint(st.Ino)
}

func (f *fakeRDMA) NetnsMode() (string, error) { return f.mode, f.modeErr }

func (f *fakeRDMA) loc(dev string) string {
	if w, ok := f.where[dev]; ok {
		return w
	}
	return f.host
}

func (f *fakeRDMA) Move(dev string, from, to *netns.NS) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failMove != nil {
		err := f.failMove
		f.failMove = nil
		return err
	}
	if f.loc(dev) != nsID(from) {
		return fmt.Errorf("RDMA device %s is not in %s", dev, from.Path())
	}
	f.where[dev] = nsID(to)
	f.moves = append(f.moves, dev)
	return nil
}

func (f *fakeRDMA) Present(dev string, in *netns.NS) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.loc(dev) == nsID(in), nil
}

// InHost reports whether dev is in the test process's netns.
func (f *fakeRDMA) InHost(dev string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.loc(dev) == f.host
}
