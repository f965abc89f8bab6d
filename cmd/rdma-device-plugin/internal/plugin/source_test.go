package plugin

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

func TestSourceReload(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.json")
	write := func(s string) { require.NoError(t, os.WriteFile(cfg, []byte(s), 0o644)) }
	write(`{"periodicUpdateInterval": 30, "resourceList": [{"resourceName": "rails", "selectors": {"devices": ["101e"]}}]}`)
	var logs bytes.Buffer
	src, err := NewSource(cfg, nic.NewScanner(fixtureRoot("dgx-h100")), slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	names := func(s Scan) map[string]int {
		out := map[string]int{}
		for _, p := range s.Pools {
			out[p.ResourceName()] = len(p.Devices)
		}
		return out
	}

	s, err := src.Scan(false)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"mellanox.com/rails": 32}, names(s))
	require.Equal(t, 30*time.Second, s.Interval)
	require.Equal(t, rdma.RDMACMPath, s.RDMACM)

	// A changed file is read only when asked to.
	write(`{"resourceList": [{"resourceName": "rails", "selectors": {"pfNames": ["ibp24s0"]}}]}`)
	s, err = src.Scan(false)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"mellanox.com/rails": 32}, names(s))
	s, err = src.Scan(true)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"mellanox.com/rails": 4}, names(s))
	require.Equal(t, 60*time.Second, s.Interval, "the default interval")
	require.Contains(t, logs.String(), "config reloaded")

	// A broken edit keeps the last good config, and says why.
	write(`{"resourceList": [`)
	s, err = src.Scan(true)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"mellanox.com/rails": 4}, names(s))
	require.Contains(t, logs.String(), "config change rejected; keeping the last good config")

	_, err = NewSource(filepath.Join(t.TempDir(), "none.json"), nic.NewScanner(fixtureRoot("dgx-h100")), slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "pool config file does not exist")
}
