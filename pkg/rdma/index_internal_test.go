package rdma

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCharKind(t *testing.T) {
	for name, want := range map[string]string{
		"uverbs0": KindUverbs, "uverbs1023": KindUverbs, "umad7": KindUmad, "issm12": KindIssm,
		"uverbs": "", "umad": "", "rdma_cm": "", "uverbs1a": "", "xuverbs1": "", "1": "", "": "", "verbs3": "",
	} {
		kind, ok := charKind(name)
		require.Equal(t, want != "", ok, name)
		require.Equal(t, want, kind, name)
	}
}
