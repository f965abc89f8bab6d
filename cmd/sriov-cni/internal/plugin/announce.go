package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// procSys is where the calling thread's netns exposes its sysctls.
const procSys = "/proc/sys/net"

// announceOnUp makes the kernel announce the pod's addresses on ifName:
// arp_notify sends a gratuitous ARP when the link comes up (and when its MAC
// changes); ndisc_notify sends an unsolicited neighbour advertisement for
// each IPv6 address once duplicate address detection has passed — an
// address still tentative cannot be advertised, so the kernel is the one
// that knows when. Switches and peers then stop sending to wherever the
// address was before. It runs in the pod's netns, before the addresses are
// added and the link is brought up. IPoIB links take part too: ARP over
// IPoIB is how their peers learn the new QPN and GID.
func announceOnUp(ifName string) error {
	var errs []error
	for _, s := range []struct{ family, key string }{{"ipv4", "arp_notify"}, {"ipv6", "ndisc_notify"}} {
		p := filepath.Join(procSys, s.family, "conf", ifName, s.key)
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil && !(s.family == "ipv6" && errors.Is(err, fs.ErrNotExist)) {
			errs = append(errs, fmt.Errorf("%s=1 on %s: %w", s.key, ifName, err))
		}
	}
	return errors.Join(errs...)
}
