// Command guest is make e2e-kernel's check program: /init runs it inside
// a real Linux kernel (QEMU, emulated Intel 82576 igb PFs with SR-IOV, an
// IOMMU) and it runs fastpath's own binaries against that kernel, nothing
// faked: provisioning from SriovNetworkNodePolicy files, discovery and
// serve with a kubelet stand-in, the sriov CNI as a runtime calls it
// (SIGKILLs included), rdma_rxe and doctor, and a capture of the guest's
// sysfs for a fixture host. It prints one "PASS <name>" or
// "FAIL <name>: <why>" line per check and exits 1 when any failed.
//
// It is built for the guest (CGO_ENABLED=0) by test/e2e-kernel/run.sh;
// it refuses to run anywhere but a guest booted for it.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// A check is one named PASS/FAIL line. run returns nil for PASS, a
// skipError (skipf) where the kernel lacks what the check needs (a
// "SKIP: <name>: <reason>" line, counted apart, never a pass), and any
// other error for FAIL.
type check struct {
	name string
	run  func(*guest) error
}

// guest is what the checks share: the node's PFs as the kernel showed
// them at start, and where the product's files go.
type guest struct {
	ctx context.Context
	pfs []*pf // the igb PFs: the two on the wire first, the node's own last
	// wireA and wireB are the two PFs on one QEMU hub; nodePF the one on
	// user-mode networking with the default route.
	wireA, wireB, nodePF *pf
	out                  string // the raw disk the capture goes to
	logs                 string // a directory of logs that goes out with the capture
	failed               map[string]bool
	skipped              map[string]string // check name: why it skipped
	// passNote is what the current check adds to its PASS line (a figure)
	passNote string
}

// skipError is a check's answer when the kernel lacks what it needs.
type skipError struct{ reason string }

func (e *skipError) Error() string { return "skipped: " + e.reason }

// skipf skips the current check, saying what the kernel lacks.
func skipf(format string, args ...any) error {
	return &skipError{reason: fmt.Sprintf(format, args...)}
}

func main() {
	out := flag.String("out", "", "the raw disk to write the capture tar to (the guest's /dev/vda)")
	only := flag.String("checks", "", "a regular expression: run only the checks it matches (and the setup); bench/ checks run only when it names them")
	flag.Parse()
	if os.Getpid() != 1 && os.Getenv("E2E_KERNEL_GUEST") == "" {
		if b, _ := os.ReadFile("/proc/cmdline"); !bytes.Contains(b, []byte("e2e_checks=")) {
			fmt.Fprintln(os.Stderr, "guest: this program changes the kernel it runs on (VFs, drivers, netns): it runs only in make e2e-kernel's VM")
			os.Exit(2)
		}
	}
	var re *regexp.Regexp
	if *only != "" {
		var err error
		if re, err = regexp.Compile(*only); err != nil {
			fmt.Fprintln(os.Stderr, "guest: -checks:", err)
			os.Exit(2)
		}
	}
	g := &guest{ctx: context.Background(), out: *out, logs: "/tmp/e2e-logs", failed: map[string]bool{}, skipped: map[string]string{}}
	_ = os.MkdirAll(g.logs, 0o755)
	if err := writeCNINodeConfig(cniNodeConfig, cniStateDir); err != nil {
		fmt.Fprintln(os.Stderr, "guest: the CNI's node config:", err)
		os.Exit(2)
	}
	failed, skipped := 0, 0
	t0 := time.Now()
	for _, c := range checks() {
		setup := strings.HasPrefix(c.name, "setup/") || strings.HasPrefix(c.name, "capture/")
		if re != nil && !setup && !re.MatchString(c.name) {
			continue
		}
		if strings.HasPrefix(c.name, "bench/") && re == nil {
			continue // benchmarks run only when -checks names them
		}
		t := time.Now()
		g.passNote = ""
		err := runCheck(g, c)
		d := time.Since(t).Round(100 * time.Millisecond)
		var se *skipError
		if errors.As(err, &se) {
			skipped++
			g.skipped[c.name] = se.reason
			fmt.Printf("SKIP: %s: %s\n", c.name, oneLine(se.reason))
		} else if err != nil {
			failed++
			g.failed[c.name] = true
			fmt.Printf("FAIL %s: %s\n", c.name, oneLine(err.Error()))
		} else if g.passNote != "" {
			fmt.Printf("PASS %s: %s\n", c.name, g.passNote)
		} else {
			fmt.Printf("PASS %s\n", c.name)
		}
		fmt.Printf("     (%s, %v)\n", c.name, d)
	}
	fmt.Printf("guest: %d checks failed, %d skipped; %v in all\n", failed, skipped, time.Since(t0).Round(time.Second))
	if failed > 0 {
		os.Exit(1)
	}
}

// runCheck runs one check, turning a panic into its failure.
func runCheck(g *guest, c check) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return c.run(g)
}

// needs fails when a check this one builds on failed, and skips when it
// skipped (with its reason).
func (g *guest) needs(names ...string) error {
	for _, n := range names {
		if g.failed[n] {
			return fmt.Errorf("not run: %s failed", n)
		}
		if why, ok := g.skipped[n]; ok {
			return skipf("%s skipped: %s", n, why)
		}
	}
	return nil
}

// checks is the table, in the order they run: each phase leaves the node
// as the next one expects (said where it matters).
func checks() []check {
	var cs []check
	cs = append(cs, setupChecks()...)
	cs = append(cs, provisionChecks()...)
	cs = append(cs, serveChecks()...)
	cs = append(cs, withRDMABytes(cniChecks())...)
	cs = append(cs, evidenceChecks()...)
	cs = append(cs, rdmaChecks()...)
	cs = append(cs, benchChecks()...)
	cs = append(cs, captureChecks()...) // last: it writes the logs out
	return cs
}

// oneLine keeps a message on its line of the console.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	s = strings.ReplaceAll(s, "\n", " | ")
	if len(s) > 600 {
		s = s[:600] + "…"
	}
	return s
}

// logf prints a detail line under the current check (indented: the host
// counts only lines that start with PASS or FAIL).
func logf(format string, args ...any) {
	fmt.Printf("     "+format+"\n", args...)
}

// cmdResult is what a finished command said.
type cmdResult struct {
	stdout, stderr string
	err            error
}

func (r cmdResult) String() string {
	s := strings.TrimSpace(r.stderr)
	if s == "" {
		s = strings.TrimSpace(r.stdout)
	}
	if r.err != nil {
		return fmt.Sprintf("%v: %s", r.err, s)
	}
	return s
}

// run runs a command with a bound, env added to the guest's.
func run(timeout time.Duration, env []string, stdin string, name string, args ...string) cmdResult {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s: timed out after %v", name, timeout)
	}
	return cmdResult{stdout: o.String(), stderr: e.String(), err: err}
}

// ipCmd runs iproute2's ip (by path: busybox has an ip applet of its own).
func ipCmd(args ...string) error {
	r := run(30*time.Second, nil, "", "/sbin/ip", args...)
	if r.err != nil {
		return fmt.Errorf("ip %s: %s", strings.Join(args, " "), r)
	}
	return nil
}

// waitFor polls cond every 100 ms until it returns nil or timeout passes;
// the error is cond's last.
func waitFor(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var errNotYet = errors.New("not yet")
