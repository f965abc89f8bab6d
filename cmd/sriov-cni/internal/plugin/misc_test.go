package plugin

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

func TestNewReadsHostRoot(t *testing.T) {
	t.Setenv(HostRootEnv, "/some/root")
	p := New()
	require.Equal(t, "/some/root", p.HostRoot)
	require.Nil(t, p.failpoint, "release builds have no failpoints")
	t.Setenv(HostRootEnv, "")
	require.Equal(t, "/", New().HostRoot)
}

// Every command answers skel with a *types.Error carrying a code.
func TestFuncsReturnCNIErrors(t *testing.T) {
	f := New().Funcs()
	args := &skel.CmdArgs{ContainerID: "c", IfName: "net1", Netns: "/proc/self/ns/net", StdinData: []byte(`{"name":"n","type":"macvlan"}`)}
	for name, cmd := range map[string]func(*skel.CmdArgs) error{"ADD": f.Add, "CHECK": f.Check, "STATUS": f.Status, "GC": f.GC} {
		err := cmd(args)
		var te *types.Error
		require.True(t, errors.As(err, &te), "%s: %T", name, err)
		require.Equal(t, uint(types.ErrInvalidNetworkConfig), te.Code, name)
		require.Contains(t, te.Msg, `sriov: type "macvlan"`)
	}
	require.NoError(t, f.Del(args), "DEL of a conf ADD refused succeeds")
}

// logFile is never followed through a symlink: the log goes to stderr,
// with a line that says why.
func TestLogFile(t *testing.T) {
	u := newUnit(t)
	dir := t.TempDir()
	u.p.Node.LogDir = dir
	logFile := filepath.Join(dir, "sriov.log")
	_, err := u.add(u.conf(`"logLevel":"debug","logFile":"`+logFile+`"`), "c1")
	require.NoError(t, err)
	b, err := os.ReadFile(logFile)
	require.NoError(t, err)
	require.Contains(t, string(b), "msg=attached")
	require.NotContains(t, u.log.String(), "msg=attached")

	target := filepath.Join(dir, "target")
	link := filepath.Join(dir, "link.log")
	require.NoError(t, os.Symlink(target, link))
	require.NoError(t, u.del(u.conf(`"logLevel":"debug","logFile":"`+link+`"`), "c1"))
	require.Contains(t, u.log.String(), "logFile ignored; logging to stderr")
	require.Contains(t, u.log.String(), "msg=detached")
	_, err = os.Lstat(target)
	require.ErrorIs(t, err, os.ErrNotExist, "nothing written through the symlink")
}

// On a kernel without RDMA netlink (this machine) every RDMA call says so,
// with the sentinel callers test for.
func TestNetlinkRDMAWithoutRDMANetlink(t *testing.T) {
	r := NewNetlinkRDMA()
	_, err := r.NetnsMode()
	if !errors.Is(err, ErrNoRDMANetlink) {
		t.Skipf("this kernel has RDMA netlink (NetnsMode: %v)", err)
	}
	require.ErrorContains(t, err, "is ib_core loaded?")
	host, err := netns.Current()
	require.NoError(t, err)
	defer host.Close()
	_, err = r.Present("mlx5_0", host)
	require.ErrorIs(t, err, ErrNoRDMANetlink)
	require.ErrorIs(t, r.Move("mlx5_0", host, host), ErrNoRDMANetlink)
}

// Without a deviceID the VF comes from PodResources (here the vfio VF, no
// privilege needed).
func TestResourceNameWithoutPrivilege(t *testing.T) {
	u := newUnit(t)
	sock := serveKubelet(t, &kubelet{pods: []*podresourcesapi.PodResources{
		podWith("default", "trainer-0", &podresourcesapi.ContainerDevices{ResourceName: "mellanox.com/vfio", DeviceIds: []string{vfioVF}}),
		podWith("default", "liar", &podresourcesapi.ContainerDevices{ResourceName: "mellanox.com/vfio", DeviceIds: []string{"../../etc"}}),
	}})
	u.p.NewPodResources = NewKubeletPodResources
	u.p.Node.PodResourcesSocket = sock // the conf spells the node's: accepted
	conf := `{"cniVersion":"1.1.0","name":"rdma-net","type":"sriov","stateDir":"` + u.stateDir + `","resourceName":"mellanox.com/vfio","podResourcesSocket":"` + sock + `"}`
	a := u.args(conf, "c1")
	a.Args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=trainer-0"
	var out bytes.Buffer
	u.p.Stdout = &out
	require.NoError(t, u.p.Add(a))
	require.Contains(t, out.String(), vfioVF)
	require.NoError(t, u.p.Del(a))
	require.Empty(t, ls(t, u.stateDir))

	a.Args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=liar"
	err := u.p.Add(a)
	require.ErrorContains(t, err, `"../../etc", which is not a PCI address`)
	require.Equal(t, uint(types.ErrInvalidNetworkConfig), CNIError(err).Code)
	a.Args = "K8S_POD_NAMESPACE=default"
	require.Equal(t, uint(types.ErrInvalidEnvironmentVariables), CNIError(u.p.Add(a)).Code)
	a.Args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=trainer-0"
	u.p.NewPodResources = func(string) PodResources { return failingPodResources{} }
	require.Equal(t, uint(types.ErrTryAgainLater), CNIError(u.p.Add(a)).Code)
}

type failingPodResources struct{}

func (failingPodResources) Pod(context.Context, string, string) (PodDevices, error) {
	return PodDevices{}, types.NewError(types.ErrTryAgainLater, "kubelet restarting", "")
}

// STATUS says the plugin cannot serve ADDs while its state dir cannot be
// written, and leaves no file there to check it.
func TestStatusStateDir(t *testing.T) {
	u := newUnit(t)
	require.NoError(t, u.p.Status(u.args(u.conf(""), "")))
	require.Empty(t, ls(t, u.stateDir))
	if os.Geteuid() == 0 {
		t.Skip("root writes to a 0500 directory")
	}
	require.NoError(t, os.Chmod(u.stateDir, 0o500))
	defer os.Chmod(u.stateDir, 0o700)
	err := u.p.Status(u.args(u.conf(""), ""))
	require.Equal(t, uint(types.ErrPluginNotAvailable), CNIError(err).Code)
	require.ErrorContains(t, err, "is not writable")
}
