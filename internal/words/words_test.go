package words

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestList(t *testing.T) {
	for _, tc := range []struct {
		items []string
		n     int
		want  string
	}{
		{nil, 4, ""},
		{[]string{"a"}, 4, "a"},
		{[]string{"a", "b", "c", "d"}, 4, "a, b, c, d"},
		{[]string{"a", "b", "c", "d", "e", "f"}, 4, "a, b, c, d and 2 more"},
		{[]string{"a", "b"}, 0, "a and 1 more"},
	} {
		require.Equal(t, tc.want, List(tc.items, tc.n), "%v, %d", tc.items, tc.n)
	}
}
