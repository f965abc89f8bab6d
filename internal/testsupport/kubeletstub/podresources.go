package kubeletstub

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"sync"

	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// PodResources stands in for the kubelet's PodResources API (v1): List
// answers with the pods a test set.
type PodResources struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	Socket string

	mu   sync.Mutex // guards the fields below
	pods []*podresourcesapi.PodResources
	srv  *grpc.Server
	done chan struct{}
}

// NewPodResources returns a stand-in for socket; call Start.
func NewPodResources(socket string) *PodResources { return &PodResources{Socket: socket} }

// Start listens on the socket.
func (p *PodResources) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		return errors.New("kubeletstub: PodResources already started")
	}
	if err := os.Remove(p.Socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("kubeletstub: remove %s: %w", p.Socket, err)
	}
	l, err := net.Listen("unix", p.Socket)
	if err != nil {
		return fmt.Errorf("kubeletstub: listen %s: %w", p.Socket, err)
	}
	g := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(g, p)
	done := make(chan struct{})
	p.srv, p.done = g, done
	go func() {
		defer close(done)
		_ = g.Serve(l)
	}()
	return nil
}

// Stop stops serving and removes the socket.
func (p *PodResources) Stop() {
	p.mu.Lock()
	g, done := p.srv, p.done
	p.srv, p.done = nil, nil
	p.mu.Unlock()
	if g == nil {
		return
	}
	g.Stop()
	<-done
	_ = os.Remove(p.Socket)
}

// Set replaces the pods List reports.
func (p *PodResources) Set(pods ...*podresourcesapi.PodResources) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pods = pods
}

// List answers with the pods set.
func (p *PodResources) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return &podresourcesapi.ListPodResourcesResponse{PodResources: p.pods}, nil
}

// Pod is a pod whose one container holds ids of resource.
func Pod(namespace, name, resource string, ids ...string) *podresourcesapi.PodResources {
	return &podresourcesapi.PodResources{
		Namespace: namespace, Name: name,
		Containers: []*podresourcesapi.ContainerResources{{
			Name:    "c",
			Devices: []*podresourcesapi.ContainerDevices{{ResourceName: resource, DeviceIds: ids}},
		}},
	}
}
