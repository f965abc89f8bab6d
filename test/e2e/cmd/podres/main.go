// Command podres asks a kubelet's PodResources API (v1) what it advertises
// and what it handed out, one line per device, for the e2e scripts:
//
//	podres --socket /path/pod-resources/kubelet.sock allocatable [--resource R]
//	    RESOURCE<TAB>DEVICE-ID, from GetAllocatableResources
//	podres --socket /path/pod-resources/kubelet.sock list [--pod NS/NAME] [--resource R]
//	    NS/NAME<TAB>CONTAINER<TAB>RESOURCE<TAB>DEVICE-ID, from List
//
// It prints nothing (and exits 0) when nothing matches, so that the caller
// decides what counts as a failure.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "podres:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("podres", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "", "the kubelet's pod-resources socket, an absolute path (<kubelet root-dir>/pod-resources/kubelet.sock)")
	timeout := fs.Duration("timeout", 5*time.Second, "deadline for the call")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// gRPC reads "unix://relative/path" as an authority and fails with
	// "invalid (non-empty) authority"; only absolute paths work.
	if !filepath.IsAbs(*socket) {
		return fmt.Errorf("--socket %q: give the absolute path of the kubelet's pod-resources socket", *socket)
	}
	if fs.NArg() == 0 {
		return errors.New("want a command: allocatable or list")
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]

	sub := flag.NewFlagSet("podres "+cmd, flag.ContinueOnError)
	sub.SetOutput(stderr)
	resource := sub.String("resource", "", "only devices of this resource")
	pod := sub.String("pod", "", "list: only this pod, as NAMESPACE/NAME")
	if err := sub.Parse(rest); err != nil {
		return err
	}

	conn, err := grpc.NewClient("unix://"+*socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("pod-resources %s: %w", *socket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	client := podresv1.NewPodResourcesListerClient(conn)

	var lines []string
	switch cmd {
	case "allocatable":
		lines, err = allocatable(ctx, client, *resource)
	case "list":
		lines, err = list(ctx, client, *pod, *resource)
	default:
		return fmt.Errorf("unknown command %q: want allocatable or list", cmd)
	}
	if err != nil {
		return fmt.Errorf("pod-resources %s: %w", *socket, err)
	}
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
	}
	return nil
}

// allocatable returns "RESOURCE\tID" for every device the kubelet can
// hand out, sorted.
func allocatable(ctx context.Context, c podresv1.PodResourcesListerClient, resource string) ([]string, error) {
	resp, err := c.GetAllocatableResources(ctx, &podresv1.AllocatableResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetAllocatableResources: %w", err)
	}
	var out []string
	for _, d := range resp.GetDevices() {
		if resource != "" && d.GetResourceName() != resource {
			continue
		}
		for _, id := range d.GetDeviceIds() {
			out = append(out, d.GetResourceName()+"\t"+id)
		}
	}
	slices.Sort(out)
	return out, nil
}

// list returns "NS/NAME\tCONTAINER\tRESOURCE\tID" for every device assigned
// to a container, sorted; pod ("NS/NAME") and resource filter when set.
func list(ctx context.Context, c podresv1.PodResourcesListerClient, pod, resource string) ([]string, error) {
	if pod != "" && !strings.Contains(pod, "/") {
		return nil, fmt.Errorf("--pod %q: want NAMESPACE/NAME", pod)
	}
	resp, err := c.List(ctx, &podresv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("List: %w", err)
	}
	var out []string
	for _, p := range resp.GetPodResources() {
		name := p.GetNamespace() + "/" + p.GetName()
		if pod != "" && name != pod {
			continue
		}
		for _, ctr := range p.GetContainers() {
			for _, d := range ctr.GetDevices() {
				if resource != "" && d.GetResourceName() != resource {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					out = append(out, strings.Join([]string{name, ctr.GetName(), d.GetResourceName(), id}, "\t"))
				}
			}
		}
	}
	slices.Sort(out)
	return out, nil
}
