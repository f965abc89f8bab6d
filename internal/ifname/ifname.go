// Package ifname is the kernel's rule for network interface names
// (dev_valid_name in net/core/dev.c): the one check that the CNI's
// CNI_IFNAME and the pool config's ifNames and pfNames share.
package ifname

import "fmt"

// MaxLen is the longest name the kernel takes: IFNAMSIZ (16) less the NUL.
const MaxLen = 15

// Check returns nil if the kernel takes name as an interface name, and
// otherwise an error that says why not.
func Check(name string) error {
	if why := problem(name); why != "" {
		return fmt.Errorf("%q is not an interface name: %s (the kernel takes 1-%d bytes without '/', ':' or whitespace, other than \".\" and \"..\")", name, why, MaxLen)
	}
	return nil
}

func problem(name string) string {
	switch {
	case name == "":
		return "empty"
	case len(name) > MaxLen:
		return fmt.Sprintf("%d bytes long", len(name))
	case name == "." || name == "..":
		return "reserved"
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; c {
		case '/', ':':
			return fmt.Sprintf("contains %q", c)
		case 0:
			return "contains a NUL byte"
		// The kernel's isspace: \t \n \v \f \r, space, and Latin-1's
		// no-break space (0xa0, which is also a UTF-8 continuation byte).
		case '\t', '\n', '\v', '\f', '\r', ' ', 0xa0:
			return fmt.Sprintf("contains whitespace (byte %#02x)", c)
		}
	}
	return ""
}
