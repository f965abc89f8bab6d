package pci

import (
	"github.com/jaypipes/pcidb"
)

// Names resolves vendor and device IDs to model names from a pci.ids
// database. A nil *Names, or one loaded where there is no database, falls
// back to hex IDs.
type Names struct {
	db *pcidb.PCIDB
}

// LoadNames looks for pci.ids under root (/usr/share/hwdata, /usr/share/misc,
// plain or gzipped, or the file named by PCIDB_PATH) and never fetches it
// from the network, whatever PCIDB_ENABLE_NETWORK_FETCH says. Without a
// database it returns Names that answer with hex IDs.
func LoadNames(root string) *Names {
	noFetch := false
	opts := []*pcidb.WithOption{{EnableNetworkFetch: &noFetch}}
	if root != "" && root != "/" {
		opts = append(opts, pcidb.WithChroot(root))
	}
	db, err := pcidb.New(opts...)
	if err != nil {
		return &Names{}
	}
	return &Names{db: db}
}

// Loaded reports whether a pci.ids database was found.
func (n *Names) Loaded() bool { return n != nil && n.db != nil }

// Model returns the device's product name, or "vendor:device" in hex when
// the database does not know it.
func (n *Names) Model(vendor, device string) string {
	if n.Loaded() {
		if p, ok := n.db.Products[vendor+device]; ok && p.Name != "" {
			return p.Name
		}
	}
	return vendor + ":" + device
}
