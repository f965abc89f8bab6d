package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// rxeSkip decides, from whether the kernel already has rdma_rxe
// (/sys/module/rdma_rxe: loaded or built in) and from what `modprobe
// rdma_rxe` answered, whether the check must skip; the reason, in the
// kernel's or modprobe's own words, or "" to go on.
func rxeSkip(loaded bool, out []byte, err error) string {
	switch {
	case loaded, err == nil:
		return ""
	case errors.Is(err, exec.ErrNotFound):
		return "no soft-RoCE: modprobe is not installed (kmod), so rdma_rxe cannot be loaded: " + err.Error()
	}
	answer := strings.TrimSpace(string(out))
	if answer == "" {
		answer = err.Error()
	}
	// modprobe prints one line per failure; the first says it.
	if i := strings.IndexByte(answer, '\n'); i >= 0 {
		answer = answer[:i]
	}
	return "no soft-RoCE: modprobe rdma_rxe: " + answer
}

// loadRxe loads rdma_rxe unless sys (the kernel's /sys) shows it already;
// the skip reason, or "".
func loadRxe(sys string) string {
	_, statErr := os.Stat(filepath.Join(sys, "module", "rdma_rxe"))
	if statErr == nil {
		return ""
	}
	out, err := exec.Command("modprobe", "rdma_rxe").CombinedOutput()
	return rxeSkip(false, out, err)
}

// gpuProbeScript prints one line: torch's version, whether CUDA works,
// how many GPUs, whether torch.distributed has NCCL, and NCCL's version.
const gpuProbeScript = `import torch, torch.distributed as d
v = torch.cuda.nccl.version() if torch.cuda.is_available() else "-"
if isinstance(v, tuple): v = ".".join(map(str, v))
print("fastpath-probe", torch.__version__, torch.cuda.is_available(), torch.cuda.device_count(), d.is_available() and d.is_nccl_available(), v)`

// gpuStack is what part 2 runs on.
type gpuStack struct {
	Torch, NCCL string
	GPUs        int
}

// gpuDecision decides from `nvidia-smi -L` and the probe script's output
// whether the NCCL part can run: the stack, or why not.
func gpuDecision(smiOut []byte, smiErr error, pyOut []byte, pyErr error) (gpuStack, string) {
	switch {
	case errors.Is(smiErr, exec.ErrNotFound):
		return gpuStack{}, "no GPU: nvidia-smi is not installed"
	case smiErr != nil:
		return gpuStack{}, "no GPU: nvidia-smi -L: " + firstLine(smiOut, smiErr)
	case !bytes.Contains(smiOut, []byte("GPU ")):
		return gpuStack{}, "no GPU: nvidia-smi -L lists none"
	case errors.Is(pyErr, exec.ErrNotFound):
		return gpuStack{}, "no PyTorch: python3 is not installed"
	case pyErr != nil:
		return gpuStack{}, "no PyTorch: python3 -c 'import torch': " + lastLine(pyOut, pyErr)
	}
	var f []string
	for _, l := range strings.Split(string(pyOut), "\n") {
		if strings.HasPrefix(l, "fastpath-probe ") {
			f = strings.Fields(l)
		}
	}
	if len(f) != 6 {
		return gpuStack{}, fmt.Sprintf("PyTorch probe: unexpected answer %q", strings.TrimSpace(string(pyOut)))
	}
	st := gpuStack{Torch: f[1], NCCL: f[5]}
	st.GPUs, _ = strconv.Atoi(f[3])
	switch {
	case f[2] != "True" || st.GPUs == 0:
		return st, "no GPU for PyTorch " + st.Torch + ": torch.cuda.is_available() is " + f[2]
	case f[4] != "True":
		return st, "PyTorch " + st.Torch + " has no NCCL backend (torch.distributed.is_nccl_available() is False)"
	}
	return st, ""
}

// probeGPU runs the detection.
func probeGPU() (gpuStack, string) {
	smi, smiErr := exec.Command("nvidia-smi", "-L").CombinedOutput()
	var py []byte
	var pyErr error
	if smiErr == nil {
		py, pyErr = exec.Command("python3", "-c", gpuProbeScript).CombinedOutput()
	}
	return gpuDecision(smi, smiErr, py, pyErr)
}

func firstLine(out []byte, err error) string {
	s := strings.TrimSpace(string(out))
	if s == "" {
		return err.Error()
	}
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// lastLine is the last line of out (a Python traceback ends with the
// error), or err.
func lastLine(out []byte, err error) string {
	s := strings.TrimSpace(string(out))
	if s == "" {
		return err.Error()
	}
	return s[strings.LastIndexByte(s, '\n')+1:]
}
