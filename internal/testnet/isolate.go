package testnet

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// isolatedEnv marks the test binary Isolate started.
const isolatedEnv = "FASTPATH_TEST_ISOLATED"

// Isolate runs the calling test again in a network and mount namespace of
// its own — loopback up, a private /run/netns — by re-executing the test
// binary with only that test. Its veth stand-ins, named as a fixture names
// its VFs, then never clash with other packages' tests that go test runs
// at the same time, and its mounts never reach the host. It returns true
// in the re-executed test, which goes on; false in the caller, whose
// result is the isolated run's (its output is logged). Needs root.
func Isolate(t *testing.T) bool {
	t.Helper()
	RequireRoot(t, "makes a network and mount namespace for the test")
	if os.Getenv(isolatedEnv) == t.Name() {
		if err := privateNetnsDir(); err != nil {
			t.Fatalf("isolate: %v", err)
		}
		return true
	}
	args := []string{"-test.run", "^" + t.Name() + "$", "-test.v", "-test.count", "1"}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), isolatedEnv+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET | unix.CLONE_NEWNS}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("isolate: start %s: %v", os.Args[0], err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		t.Log(sc.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("isolated %s: %v", t.Name(), err)
	}
	return false
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
	return err
}
