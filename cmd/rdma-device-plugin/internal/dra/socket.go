package dra

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
)

// socketMode is the mode of the driver's sockets (dra.sock and the
// registration socket): the kubelet, root, is their only client. Set after
// listen, whatever the umask gave (issue 44, finding 7).
const socketMode = 0o600

// listenUnix is the kubeletplugin helper's default listener (a stale socket
// removed, the socket unlinked on Close, as a net.UnixListener from Listen
// does) with the socket's mode set explicitly.
func listenUnix(ctx context.Context, path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("socket %s: remove stale: %w", path, err)
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("socket %s: listen: %w", path, err)
	}
	if err := os.Chmod(path, socketMode); err != nil {
		l.Close()
		return nil, fmt.Errorf("socket %s: chmod %#o: %w", path, socketMode, err)
	}
	return l, nil
}
