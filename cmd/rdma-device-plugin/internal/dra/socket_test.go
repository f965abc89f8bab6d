package dra

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// The sockets are 0600 whatever the umask, a stale one is replaced, and
// Close removes the socket.
func TestListenUnixMode(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "dra.sock")
	require.NoError(t, os.WriteFile(path, nil, 0o666)) // a stale file
	l, err := listenUnix(context.Background(), path)
	require.NoError(t, err)
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.ModeSocket|0o600, st.Mode()&(os.ModeType|os.ModePerm))
	require.NoError(t, l.Close())
	_, err = os.Lstat(path)
	require.ErrorIs(t, err, os.ErrNotExist)
}
