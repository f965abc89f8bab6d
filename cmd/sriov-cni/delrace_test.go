package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

// A DEL that overtakes its ADD, as a runtime whose ADD timed out sends it
// (issue 46): the plugin binary's ADD and DEL of one attachment, two
// processes, the DEL started 0-40 ms after the ADD, 40 times. Whichever
// runs first, once both have returned the stand-in VF is on the host
// under its own name, not in the pod, and no state is left; DEL always
// succeeds, and ADD either succeeded (DEL then undid it) or says, with
// code 3, that its DEL came first.
func TestBinaryDelOvertakesAdd(t *testing.T) {
	h := newHost(t)
	const tries = 40
	v := dgxVFs()[0]
	h.standIn(v.netdev)
	list := h.list("1.1.0", h.hostLocal("10.93.0.0/24"))
	// ADD and DEL each through their own libcni cache: the runtime's DEL
	// does not wait for the ADD's result to be cached.
	newCNI := func(cache string) *libcni.CNIConfig {
		exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
		return libcni.NewCNIConfigWithCacheDir(h.cni.Path, filepath.Join(h.dir, cache), exec)
	}
	adder, deleter := newCNI("add-cache"), newCNI("del-cache")
	ctx := context.Background()
	var added, refused int
	for i := range tries {
		podNS := h.pod()
		r := rt(fmt.Sprintf("race-%d", i), podNS, "net1", v.addr)
		offset := time.Duration(rand.IntN(41)) * time.Millisecond
		var addErr, delErr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); _, addErr = adder.AddNetworkList(ctx, list, r) }()
		go func() { defer wg.Done(); time.Sleep(offset); delErr = deleter.DelNetworkList(ctx, list, r) }()
		wg.Wait()
		require.NoError(t, delErr, "try %d (DEL %v after ADD): DEL", i, offset)
		if addErr == nil {
			added++
		} else {
			var te *types.Error
			require.True(t, errors.As(addErr, &te), "try %d: %v", i, addErr)
			require.Equal(t, uint(types.ErrUnknownContainer), te.Code, "try %d (DEL %v after ADD): %v", i, offset, addErr)
			refused++
		}
		_, err := netlink.LinkByName(v.netdev)
		require.NoError(t, err, "try %d (DEL %v after ADD, ADD %v): %s home under its name", i, offset, addErr, v.netdev)
		require.Empty(t, podLinks(t, podNS), "try %d: nothing left in the pod", i)
		require.Empty(t, stateFiles(t, filepath.Join(h.dir, "state")), "try %d: no state", i)
	}
	t.Logf("%d tries, DEL 0-40 ms after ADD: %d ADDs finished first (DEL undid them), %d refused (DEL came first)", tries, added, refused)
	// GC with no valid attachment leaves the state dir empty.
	gc, err := libcni.ConfListFromBytes([]byte(strings.Replace(string(list.Bytes), `"name":"rdma"`, `"name":"rdma","cni.dev/valid-attachments":[]`, 1)))
	require.NoError(t, err)
	require.NoError(t, h.cni.GCNetworkList(ctx, gc, &libcni.GCArgs{}))
	ents, err := os.ReadDir(filepath.Join(h.dir, "state"))
	require.NoError(t, err)
	require.Empty(t, ents, "no state, lock or tombstone after GC")
}

// podLinks lists the links in the netns at path but lo.
func podLinks(t *testing.T, path string) []string {
	t.Helper()
	pod, err := netns.Open(path)
	require.NoError(t, err)
	defer pod.Close()
	links, err := pod.Handle().LinkList()
	require.NoError(t, err)
	var names []string
	for _, l := range links {
		if l.Attrs().Name != "lo" {
			names = append(names, l.Attrs().Name)
		}
	}
	return names
}

// stateFiles lists the state dir but for tombstones (deleted-*.json).
func stateFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		if ok, _ := filepath.Match("deleted-*.json", e.Name()); !ok {
			names = append(names, e.Name())
		}
	}
	return names
}
