package pci

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"

	"github.com/fastpath-k8s/fastpath/internal/sysfs"
)

// ClassLinks maps PCI addresses to the entries of a sysfs class directory
// whose devices hang directly below them. Every entry of /sys/class/<c> is
// a link to the device, "../../devices/pci0000:15/…/0000:18:00.1/<sub>/<name>",
// so one readlink per entry tells which function owns it: cheaper, on a
// node with thousands of VFs, than listing <sub> below every function.
// Entries below something else (virtual devices, auxiliary devices such as
// ice.roce.0) are not in the map.
type ClassLinks map[string][]string

// ReadClassLinks reads <sys>/class/<class>, whose entries live in the <sub>
// directory of their parent device ("net" for class net). A missing class
// directory (module not loaded) is an empty map. Readlinks run on workers
// goroutines; names come out sorted per function.
func ReadClassLinks(sys, class, sub string, workers int) (ClassLinks, error) {
	dir, err := sysfs.Open(filepath.Join(sys, "class", class))
	if errors.Is(err, fs.ErrNotExist) {
		return ClassLinks{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list class %s: %w", class, err)
	}
	defer dir.Close()
	names, err := dir.List(".")
	if err != nil {
		return nil, fmt.Errorf("list class %s: %w", class, err)
	}
	owners := make([]string, len(names))
	if workers < 1 {
		workers = 1
	}
	var wg sync.WaitGroup
	chunk := (len(names) + workers - 1) / workers
	for lo := 0; lo < len(names); lo += chunk {
		hi := min(lo+chunk, len(names))
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			for i := lo; i < hi; i++ {
				// A link that vanished mid-scan has no owner.
				if t, err := dir.Readlink(names[i]); err == nil {
					owners[i] = ownerOf(t, sub, names[i])
				}
			}
		}(lo, hi)
	}
	wg.Wait()
	out := make(ClassLinks)
	for i, o := range owners {
		if o != "" {
			out[o] = append(out[o], names[i]) // names are sorted, so each list is
		}
	}
	return out, nil
}

// ownerOf returns the PCI address in ".../<addr>/<sub>/<name>", or "".
func ownerOf(target, sub, name string) string {
	rest, ok := strings.CutSuffix(target, "/"+sub+"/"+name)
	if !ok {
		return ""
	}
	addr := rest[strings.LastIndexByte(rest, '/')+1:]
	if !ValidAddress(addr) {
		return ""
	}
	return addr
}
