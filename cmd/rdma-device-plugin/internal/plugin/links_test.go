package plugin

import "context"

// ChanLinks is a LinkSource fed by hand: tests and benchmarks send on C.
type ChanLinks struct{ C chan LinkEvent }

var _ LinkSource = (*ChanLinks)(nil)

// NewChanLinks returns a ChanLinks with a small buffer.
func NewChanLinks() *ChanLinks { return &ChanLinks{C: make(chan LinkEvent, 64)} }

// Subscribe forwards C until ctx ends.
func (c *ChanLinks) Subscribe(ctx context.Context) (<-chan LinkEvent, error) {
	out := make(chan LinkEvent)
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
