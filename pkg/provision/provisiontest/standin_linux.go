package provisiontest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/pkg/pci"
)

// Standin plays the kernel for a process that writes a fixture host's
// sysfs attributes, as the real provision.SysfsKernel does: it watches
// the files with inotify (IN_CLOSE_WRITE) and reacts through Host the way
// the PCI core and mlx5 do. A real attribute answers the write itself
// (EBUSY, ERANGE); a file cannot, so a write the kernel would refuse is
// logged and the file is put back to what the kernel shows, and the
// writer finds out by what it then reads (provision.Applier waits for the
// VFs on the bus, bounded).
type Standin struct {
	// Acted, when set, is called after each reaction (from Run's
	// goroutine) with what it reacted to: "sriov_numvfs <pf> <n>",
	// "drivers_probe <vf> <driver>", "unbind <vf>", each with
	// " refused" added when the kernel would refuse it.
	Acted func(what string)

	host *Host
	log  *slog.Logger
	fd   int
	dirs map[int32]string // watch descriptor -> what it watches: "bus", "driver:<name>", "pf:<addr>"
}

// NewStandin makes the write-only attributes the fixture does not carry
// (the bus's drivers_probe, each driver's unbind) and watches them and
// every SR-IOV PF's sriov_numvfs under h.Root.
func NewStandin(h *Host, log *slog.Logger) (*Standin, error) {
	bus := filepath.Join(h.Root, "sys", "bus", "pci")
	drivers, _ := os.ReadDir(filepath.Join(bus, "drivers"))
	files := []string{filepath.Join(bus, "drivers_probe")}
	for _, d := range drivers {
		files = append(files, filepath.Join(bus, "drivers", d.Name(), "unbind"))
	}
	for _, f := range files {
		if _, err := os.Stat(f); err == nil {
			continue
		}
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			return nil, fmt.Errorf("kernel stand-in: %w", err)
		}
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("kernel stand-in: inotify: %w", err)
	}
	s := &Standin{host: h, log: log, fd: fd, dirs: map[int32]string{}}
	watch := func(dir, what string) error {
		wd, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE)
		if err != nil {
			return fmt.Errorf("kernel stand-in: watch %s: %w", dir, err)
		}
		s.dirs[int32(wd)] = what
		return nil
	}
	err = watch(bus, "bus")
	for _, d := range drivers {
		err = errors.Join(err, watch(filepath.Join(bus, "drivers", d.Name()), "driver:"+d.Name()))
	}
	devs, _ := os.ReadDir(filepath.Join(bus, "devices"))
	for _, d := range devs {
		if _, serr := os.Stat(h.dev(d.Name(), "sriov_totalvfs")); serr == nil {
			err = errors.Join(err, watch(h.dev(d.Name()), "pf:"+d.Name()))
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return s, nil
}

// Watched is how many directories the stand-in watches.
func (s *Standin) Watched() int { return len(s.dirs) }

// Run reacts to writes until ctx ends, one at a time, in the order they
// were made; it closes the watch when it returns.
func (s *Standin) Run(ctx context.Context) error {
	defer unix.Close(s.fd)
	buf := make([]byte, 64<<10)
	for ctx.Err() == nil {
		fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, 100); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("kernel stand-in: poll: %w", err)
		}
		n, err := unix.Read(s.fd, buf)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("kernel stand-in: read inotify: %w", err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			off += unix.SizeofInotifyEvent + int(ev.Len)
			what, err := s.handle(s.dirs[ev.Wd], name)
			if err != nil {
				s.log.Error("kernel stand-in: write refused", "err", err)
				what += " refused"
			}
			if what != "" && s.Acted != nil {
				s.Acted(what)
			}
		}
	}
	return nil
}

// handle reacts to one write of file name in the watched what; act says
// what it did, "" for a write it had nothing to do for.
func (s *Standin) handle(what, name string) (act string, err error) {
	h := s.host
	switch {
	case strings.HasPrefix(what, "pf:") && name == "sriov_numvfs":
		pf := strings.TrimPrefix(what, "pf:")
		path := h.dev(pf, "sriov_numvfs")
		v := readTrim(path)
		n, err := strconv.Atoi(v)
		if err != nil || n == h.NumVFs(pf) {
			return "", nil // half written (the close comes later), or our own
		}
		act = fmt.Sprintf("sriov_numvfs %s %d", pf, n)
		s.log.Info("kernel stand-in: sriov_numvfs", "pf", pf, "from", h.NumVFs(pf), "to", n)
		probe, err := h.SetNumVFs(pf, n)
		if err != nil {
			// The kernel leaves the count as it was.
			_ = os.WriteFile(path, []byte(strconv.Itoa(h.NumVFs(pf))+"\n"), 0o644)
			return act, err
		}
		for _, vf := range probe {
			if err := h.Probe(vf, nil); err != nil {
				return act, err
			}
		}
		return act, nil
	case what == "bus" && name == "drivers_probe":
		addr := readTrim(filepath.Join(h.Root, "sys", "bus", "pci", "drivers_probe"))
		if !pci.ValidAddress(addr) || h.Driver(addr) != "" {
			return "", nil // the kernel probes nothing for a bound function
		}
		driver, probe, err := h.DriversProbe(addr)
		act = "drivers_probe " + addr + " " + driver
		if driver == "" {
			act += "(none)"
		}
		s.log.Info("kernel stand-in: drivers_probe", "pci", addr, "driver", driver)
		if err != nil || !probe {
			return act, err
		}
		return act, h.Probe(addr, nil)
	case strings.HasPrefix(what, "driver:") && name == "unbind":
		driver := strings.TrimPrefix(what, "driver:")
		addr := readTrim(filepath.Join(h.Root, "sys", "bus", "pci", "drivers", driver, "unbind"))
		if !pci.ValidAddress(addr) || h.Driver(addr) != driver {
			return "", nil
		}
		s.log.Info("kernel stand-in: unbind", "pci", addr, "driver", driver)
		return "unbind " + addr, h.Unbind(addr)
	}
	return "", nil
}
