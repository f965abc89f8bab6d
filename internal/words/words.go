// Package words joins lists for messages people read: at most so many
// items, then how many more, so that a warning about 900 VFs stays one line.
package words

import (
	"fmt"
	"strings"
)

// List joins at most n items with ", ", then says how many more there
// are: "a, b, c and 2 more". An n below 1 is taken as 1.
func List(items []string, n int) string {
	n = min(len(items), max(n, 1))
	if n == len(items) {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:n], ", ") + fmt.Sprintf(" and %d more", len(items)-n)
}
