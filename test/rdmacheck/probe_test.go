package main

import (
	"errors"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRxeSkip(t *testing.T) {
	exit1 := &exec.ExitError{}
	for _, tc := range []struct {
		name   string
		loaded bool
		out    string
		err    error
		want   string // "" = go on
	}{
		{"already loaded", true, "", nil, ""},
		{"loaded now", false, "", nil, ""},
		{"built in, modprobe missing", true, "", exec.ErrNotFound, ""},
		{"no modprobe", false, "", &exec.Error{Name: "modprobe", Err: exec.ErrNotFound}, `no soft-RoCE: modprobe is not installed (kmod), so rdma_rxe cannot be loaded: exec: "modprobe": executable file not found in $PATH`},
		{"no such module", false, "modprobe: FATAL: Module rdma_rxe not found in directory /lib/modules/6.1.0-18-cloud-amd64\n", exit1,
			"no soft-RoCE: modprobe rdma_rxe: modprobe: FATAL: Module rdma_rxe not found in directory /lib/modules/6.1.0-18-cloud-amd64"},
		{"no modules tree (a container)", false, "modprobe: FATAL: Module rdma_rxe not found.\nmodprobe: ERROR: could not open moddep file '/lib/modules/6.8.0/modules.dep.bin'\n", exit1,
			"no soft-RoCE: modprobe rdma_rxe: modprobe: FATAL: Module rdma_rxe not found."},
		{"refused by the kernel", false, "modprobe: ERROR: could not insert 'rdma_rxe': Operation not permitted\n", exit1,
			"no soft-RoCE: modprobe rdma_rxe: modprobe: ERROR: could not insert 'rdma_rxe': Operation not permitted"},
		{"silent failure", false, "", errors.New("exit status 1"), "no soft-RoCE: modprobe rdma_rxe: exit status 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, rxeSkip(tc.loaded, []byte(tc.out), tc.err))
		})
	}
}

func TestGPUDecision(t *testing.T) {
	smiOK := []byte("GPU 0: NVIDIA H200 (UUID: GPU-5f8e0c1a-0000-0000-0000-000000000000)\n")
	exit1 := errors.New("exit status 1")
	for _, tc := range []struct {
		name    string
		smi     []byte
		smiErr  error
		py      []byte
		pyErr   error
		want    gpuStack
		wantWhy string
	}{
		{"ready", smiOK, nil, []byte("fastpath-probe 2.5.1+cu124 True 1 True 2.21.5\n"), nil, gpuStack{Torch: "2.5.1+cu124", NCCL: "2.21.5", GPUs: 1}, ""},
		{"warnings before the answer", smiOK, nil, []byte("UserWarning: something\nfastpath-probe 2.4.0 True 8 True 2.20.5\n"), nil, gpuStack{Torch: "2.4.0", NCCL: "2.20.5", GPUs: 8}, ""},
		{"no nvidia-smi", nil, &exec.Error{Name: "nvidia-smi", Err: exec.ErrNotFound}, nil, nil, gpuStack{}, "no GPU: nvidia-smi is not installed"},
		{"no driver", []byte("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"), exit1, nil, nil, gpuStack{},
			"no GPU: nvidia-smi -L: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."},
		{"no GPU listed", []byte("No devices found.\n"), nil, nil, nil, gpuStack{}, "no GPU: nvidia-smi -L lists none"},
		{"no python", smiOK, nil, nil, &exec.Error{Name: "python3", Err: exec.ErrNotFound}, gpuStack{}, "no PyTorch: python3 is not installed"},
		{"no torch", smiOK, nil, []byte("Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\nModuleNotFoundError: No module named 'torch'\n"), exit1, gpuStack{},
			"no PyTorch: python3 -c 'import torch': ModuleNotFoundError: No module named 'torch'"},
		{"CPU-only torch", smiOK, nil, []byte("fastpath-probe 2.5.1+cpu False 0 False -\n"), nil, gpuStack{Torch: "2.5.1+cpu", NCCL: "-"},
			"no GPU for PyTorch 2.5.1+cpu: torch.cuda.is_available() is False"},
		{"no NCCL backend", smiOK, nil, []byte("fastpath-probe 2.5.1 True 1 False 2.21.5\n"), nil, gpuStack{Torch: "2.5.1", NCCL: "2.21.5", GPUs: 1},
			"PyTorch 2.5.1 has no NCCL backend (torch.distributed.is_nccl_available() is False)"},
		{"garbled", smiOK, nil, []byte("hello\n"), nil, gpuStack{}, `PyTorch probe: unexpected answer "hello"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := gpuDecision(tc.smi, tc.smiErr, tc.py, tc.pyErr)
			require.Equal(t, tc.wantWhy, why)
			require.Equal(t, tc.want, got)
		})
	}
}
