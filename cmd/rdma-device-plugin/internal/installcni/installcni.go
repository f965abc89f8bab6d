// Package installcni installs fastpath's CNI binary into the node's CNI
// bin_dir (/opt/cni/bin) as exactly one name, sriov, for the DaemonSet's
// init container (`rdma-device-plugin install-cni`). That container runs as
// root, the owner of the directory that also holds Multus's and the primary
// network's plugins, so it does only this (issue 44, finding 6):
//
//   - the directory is opened without following a link, and every name in
//     it is reached through that descriptor (openat, renameat, linkat);
//   - the binary is written to a hidden temporary name, synced, and renamed
//     over sriov, so a pod set up meanwhile runs the old binary or the new
//     one, never half of one;
//   - a sriov that is a symbolic link, or not a regular file, is refused:
//     whatever it points at is not fastpath's to replace;
//   - what it replaces is logged (size, sha256, the module a Go binary was
//     built from, its answer to CNI_COMMAND=VERSION), and a sriov that is
//     not fastpath's (upstream sriov-cni) is kept as sriov.pre-fastpath, once:
//     an existing sriov.pre-fastpath is never overwritten, so an uninstall
//     can put the original back.
package installcni

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// Name is the binary's name in the bin_dir: the type a CNI conf names.
	Name = "sriov"
	// BackupName keeps the sriov fastpath replaced when it was not fastpath's.
	BackupName = Name + ".pre-fastpath"
	// tempName is where the new binary is written before the rename; a
	// leading dot, so no conf's type names it.
	tempName = "." + Name + ".fastpath-tmp"
	// modulePath is the Go module fastpath's binaries are built from.
	modulePath = "github.com/fastpath-k8s/fastpath"
	// versionTimeout bounds the old binary's CNI_COMMAND=VERSION run;
	// versionMax caps the answer read back.
	versionTimeout = 5 * time.Second
	versionMax     = 4 << 10
)

// Previous is what sriov was before the install.
type Previous struct {
	Size   int64
	SHA256 string
	// Module is the Go main module the binary was built from, Version that
	// module's version ("" when it is not a Go binary or says nothing).
	Module, Version string
	// CNIVersion is the binary's stdout for CNI_COMMAND=VERSION, or the
	// reason there is none.
	CNIVersion string
}

// Fastpath says whether the previous binary is fastpath's own CNI.
func (p *Previous) Fastpath() bool { return p.Module == modulePath }

// Result is what Install did.
type Result struct {
	// Previous is the sriov that was replaced; nil when there was none.
	Previous *Previous
	// Unchanged: sriov already had the new binary's content.
	Unchanged bool
	// Backup is the path the previous binary was kept at ("" when none was
	// kept); BackupKept says an earlier backup was there and left as it was.
	Backup     string
	BackupKept bool
}

// Install copies the binary at src into dir as sriov. It logs what it
// replaced to log.
func Install(ctx context.Context, src, dir string, log *slog.Logger) (Result, error) {
	var res Result
	newBin, err := os.ReadFile(src)
	if err != nil {
		return res, fmt.Errorf("install %s: read the CNI binary: %w", src, err)
	}
	newSum := sha256.Sum256(newBin)

	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return res, fmt.Errorf("install into %s: open the directory (not a link, must exist: the node's CNI bin_dir): %w", dir, err)
	}
	defer unix.Close(dfd)
	dst := filepath.Join(dir, Name)

	prev, err := inspect(ctx, dfd, dir)
	if err != nil {
		return res, err
	}
	res.Previous = prev
	if prev != nil {
		log.Info("install-cni: replacing", "path", dst, "size", prev.Size, "sha256", prev.SHA256,
			"module", prev.Module, "moduleVersion", prev.Version, "cniVersion", prev.CNIVersion, "fastpath", prev.Fastpath())
		if prev.SHA256 == hex.EncodeToString(newSum[:]) {
			res.Unchanged = true
			log.Info("install-cni: already installed, the same binary", "path", dst, "sha256", prev.SHA256)
			return res, nil
		}
		if !prev.Fastpath() {
			backup := filepath.Join(dir, BackupName)
			// A second name for the same file, made only if the name is
			// free (linkat never replaces): the original survives the
			// rename below, and a backup made earlier is never overwritten.
			switch err := unix.Linkat(dfd, Name, dfd, BackupName, 0); {
			case errors.Is(err, unix.EEXIST):
				res.BackupKept = true
				log.Info("install-cni: an earlier backup exists, left as it is", "path", backup)
			case err != nil:
				return res, fmt.Errorf("install into %s: keep %s as %s: %w", dir, Name, BackupName, err)
			default:
				res.Backup = backup
				log.Info("install-cni: the replaced binary is kept for an uninstall", "path", backup)
			}
		}
	}
	if err := write(dfd, dir, newBin); err != nil {
		return res, err
	}
	log.Info("install-cni: installed", "from", src, "path", dst, "size", len(newBin), "sha256", hex.EncodeToString(newSum[:]))
	return res, nil
}

// inspect describes dir/sriov; nil when there is none. A link or anything
// but a regular file is refused.
func inspect(ctx context.Context, dfd int, dir string) (*Previous, error) {
	dst := filepath.Join(dir, Name)
	var st unix.Stat_t
	switch err := unix.Fstatat(dfd, Name, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case errors.Is(err, unix.ENOENT):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("install into %s: stat %s: %w", dir, Name, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFLNK:
		target := make([]byte, unix.PathMax)
		n, _ := unix.Readlinkat(dfd, Name, target)
		return nil, fmt.Errorf("install into %s: %s is a symbolic link (to %q), not fastpath's to replace: remove it, or point the link's owner at another name", dir, dst, target[:max(n, 0)])
	default:
		return nil, fmt.Errorf("install into %s: %s is not a regular file (mode %#o): remove it first", dir, dst, st.Mode)
	}
	fd, err := unix.Openat(dfd, Name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("install into %s: open %s: %w", dir, Name, err)
	}
	f := os.NewFile(uintptr(fd), dst)
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return nil, fmt.Errorf("install into %s: read %s: %w", dir, Name, err)
	}
	p := &Previous{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}
	if bi, err := buildinfo.Read(f); err == nil {
		p.Module, p.Version = bi.Main.Path, bi.Main.Version
	}
	p.CNIVersion = cniVersion(ctx, dst)
	return p, nil
}

// cniVersion runs path with CNI_COMMAND=VERSION (the CNI spec's one
// command without a container) and returns its answer, or why there is none.
func cniVersion(ctx context.Context, path string) string {
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = []string{"CNI_COMMAND=VERSION", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdin = strings.NewReader("{}")
	cmd.Stdout = &limitedBuffer{buf: &out, left: versionMax}
	if err := cmd.Run(); err != nil {
		return "no answer: " + err.Error()
	}
	return strings.TrimSpace(out.String())
}

// limitedBuffer keeps the first left bytes written to it and drops the rest.
type limitedBuffer struct {
	buf  *bytes.Buffer
	left int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	n := min(len(p), l.left)
	l.buf.Write(p[:n])
	l.left -= n
	return len(p), nil
}

// write puts data at dfd/sriov through a temporary file and a rename.
func write(dfd int, dir string, data []byte) (err error) {
	// A temporary file a crash left behind: unlinkat removes the name
	// itself, never what a link points at.
	if err := unix.Unlinkat(dfd, tempName, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("install into %s: remove the stale %s: %w", dir, tempName, err)
	}
	fd, err := unix.Openat(dfd, tempName, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o755)
	if err != nil {
		return fmt.Errorf("install into %s: create %s: %w", dir, tempName, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, tempName))
	defer func() {
		if err != nil {
			_ = unix.Unlinkat(dfd, tempName, 0)
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o755) // whatever the umask took away
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("install into %s: write %s: %w", dir, tempName, err)
	}
	if err = unix.Renameat(dfd, tempName, dfd, Name); err != nil {
		return fmt.Errorf("install into %s: rename %s to %s: %w", dir, tempName, Name, err)
	}
	if err := unix.Fsync(dfd); err != nil {
		return fmt.Errorf("install into %s: sync the directory: %w", dir, err)
	}
	return nil
}

// Restored is what Restore did to DIR/sriov.
type Restored struct {
	// What is "upstream" (sriov.pre-fastpath put back as sriov),
	// "removed" (fastpath's sriov removed: no earlier binary was kept),
	// "left" (the sriov there is not fastpath's: left as it is) or "none"
	// (no sriov and no backup).
	What string
	// Now is the sriov there after Restore; nil when there is none.
	Now *Previous
}

// Restore undoes Install in dir: the sriov that Install kept as
// sriov.pre-fastpath is renamed back over fastpath's (one rename, so a
// pod set up meanwhile runs one or the other); with none kept, fastpath's
// sriov is removed, and the log says that no CNI binary of that name is
// left. A sriov that is not fastpath's (replaced since the install) is
// left, and so is its backup. It logs what it did.
func Restore(ctx context.Context, dir string, log *slog.Logger) (Restored, error) {
	var res Restored
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return res, fmt.Errorf("restore %s: open the directory (not a link: the node's CNI bin_dir): %w", dir, err)
	}
	defer unix.Close(dfd)
	dst, backup := filepath.Join(dir, Name), filepath.Join(dir, BackupName)
	if err := unix.Unlinkat(dfd, tempName, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return res, fmt.Errorf("restore %s: remove the stale %s: %w", dir, tempName, err)
	}
	cur, err := inspect(ctx, dfd, dir)
	if err != nil {
		return res, err
	}
	var st unix.Stat_t
	hasBackup := false
	switch err := unix.Fstatat(dfd, BackupName, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG:
		hasBackup = true
	case err == nil:
		return res, fmt.Errorf("restore %s: %s is not a regular file (mode %#o): not fastpath's backup; look at it and remove it", dir, backup, st.Mode)
	case !errors.Is(err, unix.ENOENT):
		return res, fmt.Errorf("restore %s: stat %s: %w", dir, BackupName, err)
	}
	switch {
	case cur != nil && !cur.Fastpath():
		res.What, res.Now = "left", cur
		log.Warn("uninstall: the sriov CNI binary is not fastpath's (replaced since the install): left as it is",
			"path", dst, "sha256", cur.SHA256, "module", cur.Module, "cniVersion", cur.CNIVersion, "backupKept", hasBackup)
		return res, nil
	case hasBackup:
		if err := unix.Renameat(dfd, BackupName, dfd, Name); err != nil {
			return res, fmt.Errorf("restore %s: rename %s to %s: %w", dir, BackupName, Name, err)
		}
		if err := unix.Fsync(dfd); err != nil {
			return res, fmt.Errorf("restore %s: sync the directory: %w", dir, err)
		}
		now, err := inspect(ctx, dfd, dir)
		if err != nil {
			return res, err
		}
		res.What, res.Now = "upstream", now
		log.Info("uninstall: the sriov CNI binary fastpath replaced is back", "path", dst, "from", backup,
			"sha256", now.SHA256, "cniVersion", now.CNIVersion)
	case cur != nil:
		if err := unix.Unlinkat(dfd, Name, 0); err != nil {
			return res, fmt.Errorf("restore %s: remove fastpath's %s: %w", dir, Name, err)
		}
		if err := unix.Fsync(dfd); err != nil {
			return res, fmt.Errorf("restore %s: sync the directory: %w", dir, err)
		}
		res.What = "removed"
		log.Warn("uninstall: fastpath's sriov CNI binary removed; there was no sriov before it, so none is left: install upstream sriov-cni if a NetworkAttachmentDefinition still names type sriov",
			"path", dst, "sha256", cur.SHA256)
	default:
		res.What = "none"
		log.Info("uninstall: no sriov CNI binary and no backup of one", "dir", dir)
	}
	return res, nil
}
