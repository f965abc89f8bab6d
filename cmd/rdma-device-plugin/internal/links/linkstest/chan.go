// Package linkstest is a links.Source that tests and benchmarks feed by
// hand, for the device plugin's and the DRA driver's tests alike.
package linkstest

import (
	"context"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/links"
)

// Chan is a links.Source fed by hand: tests and benchmarks send on C.
type Chan struct{ C chan links.Event }

var _ links.Source = (*Chan)(nil)

// NewChan returns a Chan with a small buffer.
func NewChan() *Chan { return &Chan{C: make(chan links.Event, 64)} }

// Subscribe forwards C until ctx ends.
func (c *Chan) Subscribe(ctx context.Context) (<-chan links.Event, error) {
	out := make(chan links.Event)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-c.C:
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}
