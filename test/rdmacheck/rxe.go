package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

// realSys is the running kernel's sysfs.
const realSys = "/sys"

// rdmaKernel is what a phase asks of the kernel's RDMA core: rxe devices
// made and deleted, listed in a netns, and where its sysfs is. The real
// one is RDMA netlink and /sys (kernelRDMA); tests give a stand-in.
type rdmaKernel interface {
	// Sys is the kernel's sysfs, where class/infiniband/<dev> is.
	Sys() string
	// AddRxe makes an rxe device on netdev, in the calling thread's
	// netns, and waits for its port to be ACTIVE.
	AddRxe(name, netdev string) error
	// DelRxe deletes it, if it is still there.
	DelRxe(name string) error
	// Present reports whether RDMA netlink in n (nil: the calling
	// thread's netns) lists the device.
	Present(name string, n *netns.NS) (bool, error)
	// Gone waits up to timeout for the device to be unregistered and
	// reports whether it was.
	Gone(name string, timeout time.Duration) (bool, error)
}

// kernelRDMA is the running kernel.
type kernelRDMA struct{}

var _ rdmaKernel = kernelRDMA{}

func (kernelRDMA) Sys() string                                    { return realSys }
func (kernelRDMA) AddRxe(name, netdev string) error               { return addRxe(name, netdev) }
func (kernelRDMA) DelRxe(name string) error                       { return delRxe(name) }
func (kernelRDMA) Present(name string, n *netns.NS) (bool, error) { return rdmaPresent(name, n) }
func (kernelRDMA) Gone(name string, timeout time.Duration) (bool, error) {
	return rxeGone(name, timeout)
}

// rdmaNetlink opens RDMA netlink in the netns n (nil: the calling
// thread's).
func rdmaNetlink(n *netns.NS) (*netlink.Handle, error) {
	if n == nil {
		cur, err := netns.Current()
		if err != nil {
			return nil, err
		}
		defer cur.Close()
		n = cur
	}
	h, err := n.NewHandle(unix.NETLINK_RDMA)
	if err != nil {
		return nil, fmt.Errorf("RDMA netlink: %w", err)
	}
	return h, nil
}

// netnsMode is the RDMA subsystem's netns mode ("shared", "exclusive").
func netnsMode() (string, error) {
	h, err := rdmaNetlink(nil)
	if err != nil {
		return "", err
	}
	defer h.Close()
	m, err := h.RdmaSystemGetNetnsMode()
	if err != nil {
		return "", fmt.Errorf("read RDMA netns mode: %w", err)
	}
	return m, nil
}

// setNetnsMode is `rdma system set netns mode`. The kernel refuses a
// change (EBUSY) while any network namespace but the initial one exists;
// one that just closed goes away from a work queue, so EBUSY is retried
// for a while.
func setNetnsMode(mode string) error {
	h, err := rdmaNetlink(nil)
	if err != nil {
		return err
	}
	defer h.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := h.RdmaSystemSetNetnsMode(mode)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("rdma system set netns %s: %w", mode, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// addRxe is `rdma link add name type rxe netdev netdev` in the caller's
// netns, then waits for its port to be ACTIVE.
func addRxe(name, netdev string) error {
	h, err := rdmaNetlink(nil)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := h.RdmaLinkAdd(name, "rxe", netdev); err != nil {
		return fmt.Errorf("rdma link add %s type rxe netdev %s: %w", name, netdev, err)
	}
	return waitPortActive(name, 10*time.Second)
}

// delRxe deletes the rxe device name, if it is still there.
func delRxe(name string) error {
	ok, err := rdmaPresent(name, nil)
	if err != nil || !ok {
		return err
	}
	h, err := rdmaNetlink(nil)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := h.RdmaLinkDel(name); err != nil {
		return fmt.Errorf("rdma link delete %s: %w", name, err)
	}
	return nil
}

// rdmaPresent reports whether RDMA netlink in n (nil: the caller's netns)
// lists the device name.
func rdmaPresent(name string, n *netns.NS) (bool, error) {
	h, err := rdmaNetlink(n)
	if err != nil {
		return false, err
	}
	defer h.Close()
	links, err := h.RdmaLinkList()
	if err != nil {
		return false, fmt.Errorf("list RDMA devices: %w", err)
	}
	for _, l := range links {
		if l.Attrs.Name == name {
			return true, nil
		}
	}
	return false, nil
}

// rxeGone waits up to timeout for the device to be unregistered (rxe
// unregisters its device from a work queue when its netdev leaves the
// netns) and reports whether it was.
func rxeGone(name string, timeout time.Duration) (bool, error) {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := rdmaPresent(name, nil)
		if err != nil || !ok {
			return err == nil, err
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// portDir is the sysfs directory of the device's port 1 under sys.
func portDir(sys, dev string) string {
	return filepath.Join(sys, "class", "infiniband", dev, "ports", "1")
}

// waitPortActive waits for the device's port 1 to be ACTIVE (rxe's port
// follows its netdev's carrier).
func waitPortActive(dev string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(filepath.Join(portDir(realSys, dev), "state"))
		state := strings.TrimSpace(string(b))
		if err == nil && strings.HasSuffix(state, "ACTIVE") {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("%s port 1: %w", dev, err)
			}
			return fmt.Errorf("%s port 1 is %q after %s, not ACTIVE (is its netdev up, with carrier?)", dev, state, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// presentAt is k.Present in the netns at path.
func presentAt(k rdmaKernel, name, path string) (bool, error) {
	n, err := netns.Open(path)
	if err != nil {
		return false, err
	}
	defer n.Close()
	return k.Present(name, n)
}
