package pci

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"syscall"
)

// readSmall reads a small sysfs attribute with one open, one read and one
// close: sysfs hands out an attribute in a single read of at most a page,
// and a scan reads thousands of them.
func readSmall(path string) ([]byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	for err == syscall.EINTR {
		fd, err = syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, &pathError{"open", path, err}
	}
	defer syscall.Close(fd)
	buf := make([]byte, 256)
	n, err := syscall.Read(fd, buf)
	for err == syscall.EINTR {
		n, err = syscall.Read(fd, buf)
	}
	if err != nil {
		return nil, &pathError{"read", path, err}
	}
	return bytes.TrimSpace(buf[:n]), nil
}

// pathError is fs.PathError without the import cycle of wrapping twice; it
// unwraps to the errno so errors.Is(err, fs.ErrNotExist) works.
type pathError struct {
	op, path string
	err      error
}

func (e *pathError) Error() string { return e.op + " " + e.path + ": " + e.err.Error() }
func (e *pathError) Unwrap() error { return e.err }

// ReadString reads a sysfs attribute, trimmed.
func ReadString(path string) (string, error) {
	b, err := readSmall(path)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// ReadInt reads a decimal sysfs attribute.
func ReadInt(path string) (int, error) {
	s, err := ReadString(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%s: not a number: %q", path, s)
	}
	return n, nil
}

// readHex reads an ID attribute such as vendor ("0x15b3") and returns the
// four lower-case hex digits.
func readHex(path string) (string, error) {
	s, err := ReadString(path)
	if err != nil {
		return "", err
	}
	id := strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X"))
	if len(id) != 4 {
		return "", fmt.Errorf("%s: not a 16-bit hex ID: %q", path, s)
	}
	if _, err := strconv.ParseUint(id, 16, 16); err != nil {
		return "", fmt.Errorf("%s: not a 16-bit hex ID: %q", path, s)
	}
	return id, nil
}
