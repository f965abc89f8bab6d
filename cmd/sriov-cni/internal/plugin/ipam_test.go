package plugin

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"
)

// ipamScript installs a shell script as the IPAM plugin "fake-ipam" in a
// directory of its own, and returns that directory.
func ipamScript(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fake-ipam"), []byte("#!/bin/sh\n"+body+"\n"), 0o755))
	return dir
}

// An IPAM plugin that dies, prints no JSON, exits without output or gives
// an error without a code fails ADD with a message that says so and a code
// that is never 0; its own code, when it gives one, survives. Whatever it
// printed on stderr reaches the plugin's log writer.
func TestIPAMFailuresNeverCodeZero(t *testing.T) {
	for _, tc := range []struct {
		name, script, msg string
		code              uint
	}{
		{"killed", `[ "$CNI_COMMAND" = DEL ] && exit 0; echo dying >&2; kill -9 $$`, "signal: killed", types.ErrInternal},
		{"non-JSON and failed", `[ "$CNI_COMMAND" = DEL ] && exit 0; echo 'panic: oops'; exit 2`, `printed no JSON error: "panic: oops"`, types.ErrInternal},
		{"no output", `[ "$CNI_COMMAND" = DEL ] && exit 0; echo 'no range' >&2; exit 1`, `without output; stderr: "no range"`, types.ErrInternal},
		{"error with code 0", `[ "$CNI_COMMAND" = DEL ] && exit 0; echo '{"code":0,"msg":"zero"}'; exit 1`, "an error without a code: zero", types.ErrInternal},
		{"its own code", `[ "$CNI_COMMAND" = DEL ] && exit 0; echo '{"cniVersion":"1.1.0","code":11,"msg":"pool busy"}'; exit 1`, "pool busy", types.ErrTryAgainLater},
		{"non-JSON and exit 0", `[ "$CNI_COMMAND" = DEL ] && exit 0; echo 'all good'`, "IPAM fake-ipam ADD", types.ErrInternal},
		{"success without output", `exit 0`, "IPAM fake-ipam ADD", types.ErrInternal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUnit(t)
			u.cniPath = ipamScript(t, tc.script)
			_, err := u.add(u.conf(`"trust":"on","ipam":{"type":"fake-ipam"}`), "c1")
			require.Error(t, err)
			e := CNIError(err)
			require.Equal(t, tc.code, e.Code, "%v", e)
			require.Contains(t, e.Msg, tc.msg)
			require.Contains(t, e.Msg, "VF 0000:86:00.1: IPAM fake-ipam ADD")
			if strings.Contains(tc.script, ">&2") {
				require.Contains(t, u.log.String(), "fake-ipam: ", "IPAM stderr reaches the injected writer")
			}
			u.requireClean()
		})
	}
}

// The IPAM plugin inherits the VF's lock: an IPAM ADD that outlives a
// killed plugin holds the VF until it is done, so the DEL that follows
// cannot release the address before it is allocated.
func TestIPAMInheritsTheLock(t *testing.T) {
	u := newUnit(t)
	pidFile := filepath.Join(t.TempDir(), "orphan.pid")
	// The plugin answers, leaving behind a child that still has fd 3.
	u.cniPath = ipamScript(t, fmt.Sprintf(`sleep 30 <&- >&- 2>&- & echo $! > %s
echo '{"cniVersion":"1.1.0","ips":[{"address":"10.61.0.2/24"}]}'`, pidFile))
	store := u.store()
	lock, err := store.Lock(vfioVF, time.Second)
	require.NoError(t, err)
	_, err = u.p.ipamCall(t.Context(), "ADD", u.args(u.conf(`"ipam":{"type":"fake-ipam"}`), "c1"), "fake-ipam", lock)
	require.NoError(t, err)
	lock.Unlock(false) // the plugin is gone; its child is not
	b, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	p, err := os.FindProcess(pid)
	require.NoError(t, err)
	defer p.Kill()

	_, err = store.Lock(vfioVF, 50*time.Millisecond)
	require.ErrorContains(t, err, "still held", "the orphan holds the VF")
	require.NoError(t, p.Kill())
	l, err := store.Lock(vfioVF, 10*time.Second)
	require.NoError(t, err, "free once the orphan is gone")
	l.Unlock(true)
}
