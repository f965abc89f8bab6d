package pci

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/fastpath-k8s/fastpath/internal/sysfs"
)

// ReadString reads a sysfs attribute at path, trimmed.
func ReadString(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func readInt(d sysfs.Dir, name string) (int, error) {
	b, err := d.Read(name)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(string(b))
	if err != nil {
		return 0, fmt.Errorf("%s/%s: not a number: %q", d.Path(), name, b)
	}
	return n, nil
}

// readHex reads an ID attribute such as vendor ("0x15b3") and returns the
// four lower-case hex digits.
func readHex(d sysfs.Dir, name string) (string, error) {
	b, err := d.Read(name)
	if err != nil {
		return "", err
	}
	id, ok := hexDigits(string(b), 4)
	if !ok {
		return "", fmt.Errorf("%s/%s: not a 16-bit hex ID: %q", d.Path(), name, b)
	}
	return id, nil
}

// readClass reads the class attribute ("0x020700") in that exact form.
func readClass(d sysfs.Dir) (string, error) {
	b, err := d.Read("class")
	if err != nil {
		return "", err
	}
	id, ok := hexDigits(string(b), 6)
	if !ok {
		return "", fmt.Errorf("%s/class: not a 24-bit class code: %q", d.Path(), b)
	}
	return "0x" + id, nil
}

func hexDigits(s string, n int) (string, bool) {
	s = strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X"))
	if len(s) != n {
		return "", false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", false
		}
	}
	return s, true
}

// fromUevent fills vendor, device, class and driver from the function's
// uevent attribute (PCI_ID=15B3:101E, PCI_CLASS=20700, DRIVER=mlx5_core),
// the kernel's own one-read summary, making its strings with str. It
// reports false when uevent is missing or lacks the IDs, and the caller
// reads the single attributes.
func (f *Function) fromUevent(d sysfs.Dir, str interned) bool {
	var buf [1024]byte
	b, err := d.ReadTo("uevent", buf[:])
	if err != nil {
		return false
	}
	var id, class, driver []byte
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		k, v, ok := bytes.Cut(bytes.TrimSpace(line), []byte("="))
		if !ok {
			continue
		}
		switch string(k) {
		case "PCI_ID":
			id = v
		case "PCI_CLASS":
			class = v
		case "DRIVER":
			driver = v
		}
	}
	vendor, device, ok := bytes.Cut(id, []byte(":"))
	if !ok || len(vendor) != 4 || len(device) != 4 || len(class) > 6 {
		return false
	}
	var ids [8]byte
	var cls [8]byte
	copy(cls[:], "0x000000")
	copy(cls[8-len(class):], class)
	if !lowerHex(ids[:4], vendor) || !lowerHex(ids[4:], device) || !lowerHex(cls[2:], cls[2:]) {
		return false
	}
	f.Vendor, f.Device, f.Class = str.of(ids[:4]), str.of(ids[4:]), str.of(cls[:])
	f.Driver = ""
	if len(driver) > 0 {
		f.Driver = str.of(driver)
	}
	return true
}

// lowerHex copies src, hex digits of either case, to dst in lower case;
// false when src has anything else.
func lowerHex(dst, src []byte) bool {
	for i, c := range src {
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		case c >= 'A' && c <= 'F':
			c += 'a' - 'A'
		default:
			return false
		}
		dst[i] = c
	}
	return true
}
