package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// doctorCheck is one finding of `rdma-device-plugin doctor -o json`.
type doctorCheck struct {
	Name    string `json:"name"`
	Status  string `json:"status"`
	Subject string `json:"subject"`
	Message string `json:"message"`
	Fix     string `json:"fix"`
}

func (c doctorCheck) String() string {
	s := fmt.Sprintf("%s %s [%s] %s", c.Status, c.Name, c.Subject, c.Message)
	if c.Fix != "" {
		s += " → " + c.Fix
	}
	return s
}

// runDoctor runs doctor on the fixture host (no pool config, kubelet or
// CNI dirs: those are not what the check is about) and returns its
// findings; extra are more flags (--nccl-log).
func runDoctor(bin, host string, extra ...string) ([]doctorCheck, error) {
	args := append([]string{"doctor", "--host-root", host, "--config", "", "--kubelet-dir", "",
		"--cni-bin-dir", "", "--cni-conf-dir", "", "-o", "json"}, extra...)
	cmd := exec.Command(filepath.Join(bin, "rdma-device-plugin"), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() <= 2 && out.Len() > 0) {
		return nil, fmt.Errorf("rdma-device-plugin %s: %w: %s", strings.Join(args, " "), err, errb.String())
	}
	var r struct {
		Checks []doctorCheck `json:"checks"`
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return nil, fmt.Errorf("doctor -o json: %w", err)
	}
	return r.Checks, nil
}

// named are the checks called name.
func named(checks []doctorCheck, name string) []doctorCheck {
	var out []doctorCheck
	for _, c := range checks {
		if c.Name == name {
			out = append(out, c)
		}
	}
	return out
}

// judgeDoctor says whether doctor, asked about a host whose VF's RDMA
// device is the live rxe device dev on netdev (which has addr), got from
// the kernel what the kernel has: the RDMA netns mode over RDMA netlink,
// the port ACTIVE, the address's RoCE v2 GID. Each finding is a line for
// the report; wrong ones are errors.
func judgeDoctor(checks []doctorCheck, mode, dev string) (good []string, bad []error) {
	expect := func(name string, pred func(doctorCheck) bool, want string) {
		cs := named(checks, name)
		for _, c := range cs {
			if pred(c) {
				good = append(good, c.String())
				return
			}
		}
		bad = append(bad, fmt.Errorf("doctor %s: want %s, got %v", name, want, cs))
	}
	expect("rdma-netns", func(c doctorCheck) bool {
		// "exclusive: each RDMA device…", "shared (the default): every pod…"
		return c.Status == "ok" && c.Subject == "RDMA netlink" &&
			(strings.HasPrefix(c.Message, mode+":") || strings.HasPrefix(c.Message, mode+" ("))
	}, fmt.Sprintf("ok %q from RDMA netlink", mode))
	// doctor names a port only when something is wrong with it, and
	// counts the healthy ones in one ok line.
	expect("port", func(c doctorCheck) bool {
		return c.Status == "ok" && strings.Contains(c.Message, "ACTIVE and LinkUp")
	}, dev+"'s port ACTIVE and LinkUp")
	expect("roce-gid", func(c doctorCheck) bool {
		return c.Status == "ok" && strings.Contains(c.Message, "every IPv4 address has its RoCE v2 GID")
	}, "ok: every IPv4 address has its RoCE v2 GID")
	return good, bad
}
