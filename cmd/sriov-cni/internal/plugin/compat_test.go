package plugin

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	types020 "github.com/containernetworking/cni/pkg/types/020"
	types040 "github.com/containernetworking/cni/pkg/types/040"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/stretchr/testify/require"
)

// Peer compatibility: what a NetworkAttachmentDefinition written for
// upstream sriov-cni, or rendered by the SR-IOV Network Operator, says.

// The peer documents logLevel panic|error|warning|info|debug, and the
// operator's SriovNetwork.spec.logLevel enum has "panic".
func TestParseConfLogLevels(t *testing.T) {
	for _, tc := range []struct {
		level string
		want  slog.Level
	}{
		{"", slog.LevelInfo}, {"debug", slog.LevelDebug}, {"info", slog.LevelInfo}, {"warn", slog.LevelWarn},
		{"warning", slog.LevelWarn}, {"Warning", slog.LevelWarn}, {"error", slog.LevelError}, {"panic", slog.LevelError},
		{"PANIC", slog.LevelError},
	} {
		t.Run(tc.level, func(t *testing.T) {
			c, err := parseConf([]byte(`{"name":"n","logLevel":"` + tc.level + `"}`))
			require.NoError(t, err)
			require.Equal(t, tc.want, c.logLevel)
		})
	}
}

// logLevel panic logs errors, and nothing below.
func TestLogLevelPanicLogsErrorsOnly(t *testing.T) {
	var buf bytes.Buffer
	p := &Plugin{Stderr: &buf}
	c, err := parseConf([]byte(`{"name":"n","logLevel":"panic"}`))
	require.NoError(t, err)
	log, closeLog := p.logger(c, nil)
	log.Warn("a warning")
	log.Error("an error")
	closeLog()
	require.NotContains(t, buf.String(), "a warning")
	require.Contains(t, buf.String(), "an error")
}

func TestAddWithPeerLogLevelPanic(t *testing.T) {
	u := newUnit(t)
	conf := u.conf(`"logLevel":"panic"`)
	_, err := u.add(conf, "c1")
	require.NoError(t, err)
	require.NoError(t, u.del(conf, "c1"))
	u.requireClean()
}

// addRaw runs ADD and returns the result as its cniVersion's type.
func (u *unit) addRaw(conf, cid string) (types.Result, error) {
	var out bytes.Buffer
	u.p.Stdout = &out
	if err := u.p.Add(u.args(conf, cid)); err != nil {
		require.Empty(u.t, out.String(), "nothing on stdout after a failure")
		return nil, err
	}
	return create.CreateFromBytes(out.Bytes())
}

// A network in the spec's versions before 0.3.0 (upstream takes them all,
// version.All) attaches with a result of that version, and DELs.
func TestLegacyCNIVersions(t *testing.T) {
	for _, v := range []string{"0.1.0", "0.2.0", "0.3.0", ""} {
		t.Run("v"+v, func(t *testing.T) {
			u := newUnit(t)
			conf := u.conf(`"trust":"on"`)
			if v == "" {
				conf = strings.Replace(conf, `"cniVersion":"1.1.0",`, "", 1)
			} else {
				conf = strings.Replace(conf, `"cniVersion":"1.1.0"`, `"cniVersion":"`+v+`"`, 1)
			}
			res, err := u.addRaw(conf, "c1")
			require.NoError(t, err)
			want := v
			if v == "" {
				want = "0.1.0" // the spec's default
			}
			require.Equal(t, want, res.Version())
			switch r := res.(type) {
			case *types020.Result:
				require.Equal(t, "10.60.0.2/24", r.IP4.IP.String())
			case *types040.Result:
				require.Equal(t, "10.60.0.2/24", r.IPs[0].Address.String())
				require.Equal(t, "net1", r.Interfaces[0].Name)
			default:
				t.Fatalf("result %T", res)
			}
			require.True(t, u.pf.Get(vfioPF, 0).Trust)
			require.NoError(t, u.del(conf, "c1"))
			u.requireClean()
		})
	}
}

// A 0.1.0/0.2.0 result holds IP addresses only: without ipam there is
// nothing to answer with, and ADD says so before changing anything; DEL of
// such a network still succeeds.
func TestLegacyCNIVersionWithoutIPAM(t *testing.T) {
	u := newUnit(t)
	conf := `{"cniVersion":"0.2.0","name":"rdma-net","type":"sriov","trust":"on","stateDir":"` + u.stateDir + `","deviceID":"` + vfioVF + `"}`
	_, err := u.addRaw(conf, "c1")
	require.ErrorContains(t, err, "cniVersion 0.2.0: its result holds IP addresses only")
	require.Equal(t, uint(types.ErrInvalidNetworkConfig), CNIError(err).Code)
	require.Empty(t, u.pf.Calls())
	require.NoError(t, u.del(conf, "c1"))
	u.requireClean()
}

// An IPAM plugin that gives no address, in a 0.2.0 network: the result
// cannot be expressed (the IPAM plugin's own conversion says so first; the
// plugin's, after apply, would too), and ADD rolls back everything.
func TestLegacyCNIVersionResultNotExpressible(t *testing.T) {
	u := newUnit(t)
	conf := `{"cniVersion":"0.2.0","name":"rdma-net","type":"sriov","trust":"on","stateDir":"` + u.stateDir + `","deviceID":"` + vfioVF + `",` +
		`"ipam":{"type":"static"}}`
	_, err := u.addRaw(conf, "c1")
	require.ErrorContains(t, err, "cannot convert: no valid IP addresses")
	u.requireClean()
}
