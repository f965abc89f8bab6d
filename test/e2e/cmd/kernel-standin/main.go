// Command kernel-standin plays the kernel for `make e2e`'s provisioning
// phase: the real rdma-device-plugin writes a fixture host's sysfs
// attributes (sriov_numvfs, driver_override, drivers_probe, unbind,
// MLNX_OFED's sriov/<vf>/node and port), and this process reacts to each
// write as the PCI core and mlx5 would (provisiontest.Standin). When a VF
// is probed it also makes the VF's netdev on the host, as the e2e makes
// stand-ins: a veth named as the fixture names the netdev (ibp24s0v3),
// peer s<rest> (sp24s0v3) up on the host, recorded in --links-file before
// it is made so that the test's cleanup removes it; a VF that goes takes
// its veth with it (when it is on the host: one in a pod stays there).
// The RDMA devices' new /dev/infiniband entries become char devices 1:3
// (/dev/null's numbers), as the e2e makes the fixture's.
//
//	kernel-standin --host-root DIR --links-file FILE
//
// It logs "kernel stand-in watching" once it reacts, and runs until
// SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/pkg/provision/provisiontest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(ctx, os.Args[1:], log); err != nil {
		log.Error("kernel stand-in", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("kernel-standin", flag.ContinueOnError)
	root := fs.String("host-root", "", "the fixture host whose sysfs the plugin writes (required)")
	links := fs.String("links-file", "", "file the veths made are appended to, one \"name peer\" a line, before each is made (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *root == "" || *links == "" {
		return errors.New("--host-root and --links-file are required")
	}
	l := &veths{file: *links, log: log}
	h := &provisiontest.Host{Root: *root, MLNXOFED: true, Probed: l.add, Removed: l.del}
	s, err := provisiontest.NewStandin(h, log)
	if err != nil {
		return err
	}
	devDir := filepath.Join(*root, "dev", "infiniband")
	s.Acted = func(string) {
		if err := charDevices(devDir); err != nil {
			log.Error("kernel stand-in: char devices", "err", err)
		}
	}
	log.Info("kernel stand-in watching", "root", *root, "dirs", s.Watched())
	return s.Run(ctx)
}

// veths makes and removes the VFs' veths.
type veths struct {
	file string
	log  *slog.Logger
	mu   sync.Mutex // guards the file
}

func peerOf(name string) string { return "s" + strings.TrimPrefix(name, "ib") }

func (l *veths) add(vf, name string) error {
	peer := peerOf(name)
	l.mu.Lock()
	f, err := os.OpenFile(l.file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		_, err = fmt.Fprintf(f, "%s %s\n", name, peer)
		err = errors.Join(err, f.Close())
	}
	l.mu.Unlock()
	if err != nil {
		return fmt.Errorf("record veth %s: %w", name, err)
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = name
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: peer}); err != nil {
		return fmt.Errorf("VF %s: add veth %s (peer %s): %w", vf, name, peer, err)
	}
	p, err := netlink.LinkByName(peer)
	if err == nil {
		err = netlink.LinkSetUp(p)
	}
	if err != nil {
		return fmt.Errorf("VF %s: set %s up: %w", vf, peer, err)
	}
	l.log.Info("kernel stand-in: VF netdev", "pci", vf, "veth", name, "peer", peer)
	return nil
}

func (l *veths) del(names []string) {
	for _, name := range names {
		link, err := netlink.LinkByName(name)
		if err != nil {
			continue // not on the host: in a pod, or never made
		}
		if err := netlink.LinkDel(link); err != nil {
			l.log.Error("kernel stand-in: delete veth", "veth", name, "err", err)
			continue
		}
		l.log.Info("kernel stand-in: VF netdev gone", "veth", name)
	}
}

// charDevices turns the plain files under dir (what the fixture writes
// for a new RDMA device) into char devices 1:3.
func charDevices(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := os.Remove(p); err != nil {
			return err
		}
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
		}
		if err := os.Chmod(p, 0o666); err != nil { // past the umask, as mknod -m
			return err
		}
	}
	return nil
}
