package rdma

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strconv"

	"github.com/fastpath-k8s/fastpath/internal/sysfs"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
)

// ClassCharDevices maps ib device names to their char devices as listed in
// <root>/sys/class/infiniband_verbs and infiniband_mad (each entry's ibdev
// and port attributes). Discovery reads the PCI function's own directories
// first; this is the fallback for layouts that only show the class view.
// An entry whose link leaves <root>/sys/devices is not read through.
func (r *Reader) ClassCharDevices() (map[string][]CharDevice, error) {
	out := map[string][]CharDevice{}
	for _, class := range []string{"infiniband_verbs", "infiniband_mad"} {
		if err := classCharDevices(filepath.Join(r.sys, "class", class), out); err != nil {
			return nil, err
		}
	}
	for k := range out {
		sortCharDevices(out[k])
	}
	return out, nil
}

func classCharDevices(path string, out map[string][]CharDevice) error {
	dir, err := sysfs.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer dir.Close()
	names, err := dir.List(".")
	if err != nil {
		return err
	}
	for _, e := range names {
		kind, ok := CharKind(e)
		if !ok {
			continue
		}
		if target, err := dir.Readlink(e); err != nil || !pci.ClassLinkInside(target) {
			continue
		}
		ibdev, err := dir.Read(e + "/ibdev")
		if err != nil {
			continue
		}
		cd := CharDevice{Kind: kind, Name: e, Path: DevDir + "/" + e}
		if kind != KindUverbs {
			if p, err := dir.Read(e + "/port"); err == nil {
				cd.Port, _ = strconv.Atoi(string(p))
			}
		}
		out[string(ibdev)] = append(out[string(ibdev)], cd)
	}
	return nil
}
