package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// SameKernel reports whether root is this machine's root as the running
// kernel sees it, so that doctor may ask the kernel (netlink) about the
// node: root is "/", or <root>/sys is a sysfs mount (only the running
// kernel serves one: the plugin's pod mounts the node's /sys at /host/sys),
// or <root>/proc has the running kernel's boot_id (kubectl debug node's
// /host).
func SameKernel(root string) bool {
	if filepath.Clean(root) == "/" {
		return true
	}
	var fs unix.Statfs_t
	if unix.Statfs(filepath.Join(root, "sys"), &fs) == nil && fs.Type == unix.SYSFS_MAGIC {
		return true
	}
	const bootID = "proc/sys/kernel/random/boot_id"
	ours, err := os.ReadFile("/" + bootID)
	if err != nil {
		return false
	}
	theirs, err := os.ReadFile(filepath.Join(root, bootID))
	return err == nil && strings.TrimSpace(string(ours)) == strings.TrimSpace(string(theirs))
}

// nodeProblem says what is wrong with <devDir>/<name> for a device sysfs
// numbers devno; "" when nothing.
func nodeProblem(devDir, name, devno string) (kind, detail string) {
	path := filepath.Join(devDir, name)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "missing", name
		}
		return "unreadable", fmt.Sprintf("%s (%v)", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return "not a char device", name
	}
	if got := fmt.Sprintf("%d:%d", unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev))); got != devno {
		return "stale", fmt.Sprintf("%s is %s, sysfs says %s", name, got, devno)
	}
	return "", ""
}
