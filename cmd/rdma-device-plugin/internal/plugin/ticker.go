package plugin

import "time"

// ticker is a time.Ticker that can be off (interval 0).
type ticker struct{ t *time.Ticker }

func newTicker(d time.Duration) *ticker {
	t := &ticker{}
	t.reset(d)
	return t
}

func (t *ticker) reset(d time.Duration) {
	if t.t != nil {
		t.t.Stop()
		t.t = nil
	}
	if d > 0 {
		t.t = time.NewTicker(d)
	}
}

func (t *ticker) c() <-chan time.Time {
	if t.t == nil {
		return nil
	}
	return t.t.C
}

func (t *ticker) stop() { t.reset(0) }
