package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/kubeletstub"
)

// doctor is the demo's last step: a copy of the fixture host with real
// char devices (as udev makes them on a node), the device plugin serving
// it to the kubelet stand-in, and `rdma-device-plugin doctor` on it —
// healthy, then after one rail's VFs are disabled.
func (d *demo) doctor(ctx context.Context, stub *kubeletstub.Stub, bin, kdir, config string) error {
	d.step("doctor on the fixture host, the plugin serving it, the CNI built above")
	fmt.Fprintln(d.out, "  (another host: a copy of dgx-h100 whose /dev/infiniband holds real char devices, made with mknod as\n"+
		"   udev makes them on a node, where the committed host has empty files; its path is gone after the demo:\n"+
		"   on the committed host, go run ./cmd/rdma-device-plugin doctor --host-root testdata/sysfs/dgx-h100 --config testdata/config/combined.json)")
	host := filepath.Join(d.work, "node")
	if err := fixture.Write(host, "dgx-h100"); err != nil {
		return err
	}
	if err := fixture.MakeCharDevices(host); err != nil {
		return err
	}
	var dpLog bytes.Buffer
	dp := exec.CommandContext(ctx, filepath.Join(bin, "rdma-device-plugin"), "--host-root", host, "--node-root", host, "--config", config,
		"--kubelet-dir", kdir, "--devinfo-dir", filepath.Join(d.work, "devinfo-doctor"), "--metrics-addr", "", "--log-level", "warn")
	dp.Stdout = io.MultiWriter(&dpLog, d.logs)
	dp.Stderr = dp.Stdout
	if err := dp.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- dp.Wait() }()
	stop := func() error {
		if dp.ProcessState != nil {
			return nil
		}
		_ = dp.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			return err
		case <-time.After(10 * time.Second):
			_ = dp.Process.Kill()
			return errors.Join(errors.New("device plugin did not stop on SIGTERM"), <-exited)
		}
	}
	d.defer_(stop)
	for range 2 { // both pools of the config
		if _, err := stub.WaitRegistration(15 * time.Second); err != nil {
			return fmt.Errorf("%w; plugin log:\n%s", err, dpLog.String())
		}
	}
	// No Multus here: the demo attaches with libcni directly.
	args := []string{"doctor", "--host-root", host, "--config", config, "--kubelet-dir", kdir, "--cni-bin-dir", bin, "--cni-conf-dir", ""}
	if err := d.runDoctor(bin, args, 0); err != nil {
		return err
	}
	d.step("rail 0's VFs disabled (echo 0 > /sys/bus/pci/devices/0000:18:00.0/sriov_numvfs): doctor again")
	if err := fixture.DisableVFs(host, "0000:18:00.0"); err != nil {
		return err
	}
	if err := d.runDoctor(bin, args, 1); err != nil {
		return err
	}
	if err := stop(); err != nil {
		return fmt.Errorf("device plugin exit: %v; log:\n%s", err, dpLog.String())
	}
	return nil
}

// runDoctor runs the doctor, prints its table and checks its exit status.
func (d *demo) runDoctor(bin string, args []string, want int) error {
	cmd := exec.Command(filepath.Join(bin, "rdma-device-plugin"), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		return err
	}
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = shellQuote(a)
	}
	fmt.Fprintf(d.out, "  $ rdma-device-plugin %s\n", strings.Join(quoted, " "))
	for _, l := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
		fmt.Fprintf(d.out, "  %s\n", l)
	}
	fmt.Fprintf(d.out, "  exit status %d\n", code)
	if code != want {
		return fmt.Errorf("doctor exited %d, want %d", code, want)
	}
	return nil
}

// shellQuote is a as a shell reads it back: two single quotes for the
// empty string (a flag's empty value), quoted when it holds anything but
// a path's or a flag's characters.
func shellQuote(a string) string {
	if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,") == "" {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}
