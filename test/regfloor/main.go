// Command regfloor is not fastpath code but a yardstick for the device
// plugin's start (BenchmarkDaemonStart's floor row): the least a Go device
// plugin built on the kubelet's v1beta1 API does from exec to registered.
// It reads no config, opens no metrics listener: it serves one gRPC server
// per resource on a unix socket in the kubelet's plugin directory and
// registers each with the kubelet, as rdma-device-plugin does for its
// pools, then waits for SIGTERM.
//
// It discovers nothing unless given -vfs: then, before it serves, it
// makes one discovery floor pass (package internal/testsupport/floor) over the VFs
// listed in that file (written by floor.Write) below -root, which is the
// least a plugin that reads the node before it registers does on a large
// host. With -list too, the pass first lists the bus and the four class
// directories (floor.Listings), where a plugin learns the names that -vfs
// gives.
//
// Built without the nodra tag (dra.go), it also links the DRA kubelet
// plugin library and client-go, as rdma-device-plugin-dra does:
// BenchmarkDaemonRSSDRA's floor. -dra starts that plugin too.
//
//	regfloor [-root DIR -vfs FILE [-list]] [-dra DRIVER] <kubelet-dir> <resource>...
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/floor"
)

type server struct {
	pluginapi.UnimplementedDevicePluginServer
}

// startDRA starts a DRA kubelet plugin for the node if -dra asks for one
// (dra.go; a build with the nodra tag has neither) and returns its stop.
var startDRA = func(context.Context, string) (func(), error) { return func() {}, nil }

func main() {
	root := flag.String("root", "/", "the host root -vfs is read below")
	vfs := flag.String("vfs", "", "make a discovery floor pass over the VFs in this file first")
	list := flag.Bool("list", false, "with -vfs: list the bus and class directories first")
	flag.Parse()
	if flag.NArg() < 2 {
		fmt.Fprintln(os.Stderr, "usage: regfloor [-root DIR -vfs FILE [-list]] [-dra DRIVER] <kubelet-dir> <resource>...")
		os.Exit(2)
	}
	if *list && *vfs == "" {
		fmt.Fprintln(os.Stderr, "regfloor: -list needs -vfs")
		os.Exit(2)
	}
	if *vfs != "" {
		if err := discover(*root, *vfs, *list); err != nil {
			fmt.Fprintln(os.Stderr, "regfloor:", err)
			os.Exit(1)
		}
	}
	stopDRA, err := startDRA(context.Background(), os.Getenv("NODE_NAME"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "regfloor:", err)
		os.Exit(1)
	}
	err = run(flag.Arg(0), flag.Args()[1:])
	stopDRA()
	if err != nil {
		fmt.Fprintln(os.Stderr, "regfloor:", err)
		os.Exit(1)
	}
}

// discover makes one floor pass over the VFs listed in file, after the
// listings if list.
func discover(root, file string, list bool) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	vfs, err := floor.Read(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	p, err := floor.Open(root)
	if err != nil {
		return err
	}
	defer p.Close()
	if list {
		if err := p.Run(floor.Listings(), runtime.GOMAXPROCS(0)); err != nil {
			return err
		}
	}
	return p.Run(floor.Ops(vfs), runtime.GOMAXPROCS(0))
}

func run(dir string, resources []string) error {
	// Before the first registration: the kubelet side may stop it as soon
	// as it has registered.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	var servers []*grpc.Server
	endpoints := make([]string, len(resources))
	for i, r := range resources {
		endpoints[i] = strings.NewReplacer("/", "_", ".", "_").Replace(r) + ".sock"
		sock := filepath.Join(dir, endpoints[i])
		os.Remove(sock)
		l, err := net.Listen("unix", sock)
		if err != nil {
			return err
		}
		g := grpc.NewServer()
		pluginapi.RegisterDevicePluginServer(g, server{})
		go g.Serve(l)
		servers = append(servers, g)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	client := pluginapi.NewRegistrationClient(conn)
	errs := make([]error, len(resources))
	var wg sync.WaitGroup
	for i, r := range resources {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, errs[i] = client.Register(ctx, &pluginapi.RegisterRequest{
				Version: pluginapi.Version, Endpoint: endpoints[i], ResourceName: r,
			})
		})
	}
	wg.Wait()
	conn.Close()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	<-sig
	for _, g := range servers {
		g.Stop()
	}
	return nil
}
