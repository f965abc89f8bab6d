package main

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// The DaemonSet's containers run the plugin as root with a capability set
// of their own (deployments/20-daemonset.yaml: drop ALL;
// deployments/components/provision adds NET_ADMIN; allowPrivilegeEscalation
// false). The guest runs the plugin the same way: setpriv (util-linux)
// empties the bounding set but for those capabilities, empties the
// inheritable set and sets no_new_privs, then execs the plugin, to which
// the kernel, root as it is, gives only what the bounding set left
// (cap_bprm_creds_from_file). The CNI is the runtime's child, with all of
// root's capabilities, and runs as it is.

const setpriv = "/usr/bin/setpriv"

var (
	// baseCaps are the base DaemonSet's: serve, discover, doctor.
	baseCaps []string
	// provisionCaps are the provision component's.
	provisionCaps = []string{"net_admin"}
)

// asDaemonSet is the command that runs the plugin with args as a DaemonSet
// container with caps runs it.
func asDaemonSet(caps []string, args ...string) (string, []string) {
	set := "-all"
	for _, c := range caps {
		set += ",+" + c
	}
	return setpriv, append([]string{"--no-new-privs", "--bounding-set=" + set, "--inh-caps=-all", "--", plugin}, args...)
}

// capEff is the effective capability mask of process pid, as
// /proc/<pid>/status shows it.
func capEff(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("/proc/%d/status has no CapEff", pid)
}

// daemonSetCapsCheck runs a process as each set and reads what it got:
// none for the base DaemonSet, CAP_NET_ADMIN (bit 12) for provisioning.
func daemonSetCapsCheck(g *guest) error {
	for _, c := range []struct {
		caps []string
		want string
	}{{baseCaps, "0000000000000000"}, {provisionCaps, "0000000000001000"}} {
		_, argv := asDaemonSet(c.caps)
		argv = append(argv[:len(argv)-1], "/bin/cat", "/proc/self/status") // the same set, another program
		r := run(30*time.Second, nil, "", setpriv, argv...)
		if r.err != nil {
			return fmt.Errorf("setpriv %s: %s", strings.Join(argv, " "), r)
		}
		var got string
		for _, l := range strings.Split(r.stdout, "\n") {
			if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
				got = strings.TrimSpace(v)
			}
		}
		if got != c.want {
			return fmt.Errorf("a process run with capabilities %v has CapEff %q, want %s", c.caps, got, c.want)
		}
		logf("capabilities %v: CapEff %s", c.caps, got)
	}
	return nil
}
