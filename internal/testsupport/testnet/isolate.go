package testnet

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// isolatedEnv marks a test binary that Main has already started in
// namespaces of its own.
const isolatedEnv = "FASTPATH_TEST_ISOLATED"

// Main runs a package's tests; call it from TestMain in every package
// whose tests make links, named network namespaces or mounts. As root, the
// test binary first runs itself again, with the same arguments, in a
// network and a mount namespace of its own: loopback up, an empty
// /run/netns, mounts private. go test runs packages in parallel, and two
// packages' stand-ins named as the same fixture VF (ibp24s0v0) would
// otherwise meet in the host's namespace, beside the host's own links.
// Without root (those tests skip) and in a fuzz worker (its coordinator is
// already isolated, and talks to it over inherited descriptors) the tests
// run where they are. The returned code is for os.Exit, after the caller's
// own cleanup.
func Main(m *testing.M) int {
	if fuzzWorker() {
		return m.Run()
	}
	return Own(m.Run)
}

// Own calls run in a network and a mount namespace of the process's own,
// as Main does for tests (make demo runs the same way, so that its
// stand-ins never meet the host's links): as root, the binary runs itself
// again there, with the same arguments, and Own returns its exit code;
// in that second process, or without root, Own calls run.
func Own(run func() int) int {
	if os.Geteuid() != 0 {
		return run()
	}
	if os.Getenv(isolatedEnv) == "" {
		code, err := reexec()
		if err != nil {
			fmt.Fprintln(os.Stderr, "testnet:", err)
			return 1
		}
		return code
	}
	if err := privateNetnsDir(); err != nil {
		fmt.Fprintln(os.Stderr, "testnet:", err)
		return 1
	}
	return run()
}

func fuzzWorker() bool {
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "-test.fuzzworker") {
			return true
		}
	}
	return false
}

// reexec runs the binary again in new network and mount namespaces
// and returns its exit code; the child dies with this process.
func reexec() (int, error) {
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), isolatedEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNET | unix.CLONE_NEWNS,
		Pdeathsig:  syscall.SIGKILL,
	}
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 0, fmt.Errorf("isolated %s: %v", os.Args[0], ws.Signal())
		}
		return exit.ExitCode(), nil
	}
	if err != nil {
		return 0, fmt.Errorf("isolated %s: %w", os.Args[0], err)
	}
	return 0, nil
}

// privateNetnsDir makes the mount namespace private, gives it an empty
// /run/netns and brings loopback up in the new network namespace.
func privateNetnsDir() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := os.MkdirAll("/run/netns", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("fastpath-test-netns", "/run/netns", "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount /run/netns: %w", err)
	}
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}
