// Command regfloor is not fastpath code but a yardstick for the device
// plugin's start (BenchmarkDaemonStart's floor row): the least a Go device
// plugin built on the kubelet's v1beta1 API does from exec to registered.
// It discovers nothing, reads no config, opens no metrics listener: it
// serves one gRPC server per resource on a unix socket in the kubelet's
// plugin directory and registers each with the kubelet, as
// rdma-device-plugin does for its pools, then waits for SIGTERM.
//
//	regfloor <kubelet-dir> <resource>...
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type server struct {
	pluginapi.UnimplementedDevicePluginServer
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: regfloor <kubelet-dir> <resource>...")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "regfloor:", err)
		os.Exit(1)
	}
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
