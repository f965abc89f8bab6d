package latency

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var s Samples
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {0, time.Millisecond}} {
		if got := s.Percentile(tc.p); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if s[0] != 100*time.Millisecond {
		t.Error("Percentile sorted the caller's samples")
	}
	if (Samples{}).Percentile(50) != 0 {
		t.Error("no samples: want 0")
	}
}
