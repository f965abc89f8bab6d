package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ncclTransport is what an NCCL_DEBUG=INFO log says about the network
// NCCL chose: "Using network X" (init), the devices of "NET/IB : Using …"
// or "NET/Socket : Using …", and the transport each channel connected
// over ("Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0").
type ncclTransport struct {
	Network  string
	IB       string
	Socket   string
	Channels map[string]int
}

var (
	reNetwork = regexp.MustCompile(`NCCL INFO Using network (\S+)`)
	reIB      = regexp.MustCompile(`NET/IB ?: ?Using (.*)`)
	reSocket  = regexp.MustCompile(`NET/Socket ?: ?Using (.*)`)
	reChannel = regexp.MustCompile(`Channel \d+/\d+ : .* via NET/(\w+)/`)
)

func parseTransport(log string) ncclTransport {
	t := ncclTransport{Channels: map[string]int{}}
	for _, l := range strings.Split(log, "\n") {
		if m := reNetwork.FindStringSubmatch(l); m != nil && t.Network == "" {
			t.Network = m[1]
		}
		if m := reIB.FindStringSubmatch(l); m != nil && t.IB == "" {
			t.IB = strings.TrimSpace(m[1])
		}
		if m := reSocket.FindStringSubmatch(l); m != nil && t.Socket == "" {
			t.Socket = strings.TrimSpace(m[1])
		}
		if m := reChannel.FindStringSubmatch(l); m != nil {
			t.Channels[m[1]]++
		}
	}
	return t
}

// wantTransport checks that the log's transport is kind ("Socket", or "IB"
// over the RoCE device hca) and nothing else.
func wantTransport(t ncclTransport, kind, hca string) error {
	if t.Network != kind {
		return fmt.Errorf("NCCL chose network %q, want %s (no \"Using network %s\" line)", t.Network, kind, kind)
	}
	for ch, n := range t.Channels {
		if ch != kind {
			return fmt.Errorf("%d channels connected via NET/%s, want NET/%s only", n, ch, kind)
		}
	}
	switch kind {
	case "Socket":
		if t.Socket == "" {
			return fmt.Errorf("no \"NET/Socket : Using\" line")
		}
		if t.IB != "" {
			return fmt.Errorf("NET/IB came up (%s) though the run disabled it", t.IB)
		}
	case "IB":
		if !strings.Contains(t.IB, "]"+hca+":1/RoCE") {
			return fmt.Errorf("NET/IB uses %q, want %s port 1 over RoCE ([0]%s:1/RoCE)", t.IB, hca, hca)
		}
	default:
		return fmt.Errorf("unknown transport %q", kind)
	}
	return nil
}

// rankResult is allreduce.py's RESULT line.
type rankResult struct {
	Rank   int
	OK     bool
	Bytes  int64
	TimeUS int64
	AlgBW  float64 // GB/s
}

// parseResult finds the RESULT line in a rank's output.
func parseResult(out string) (rankResult, error) {
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "RESULT ") {
			continue
		}
		var r rankResult
		var ok string
		if _, err := fmt.Sscanf(l, "RESULT rank=%d ok=%s bytes=%d time_us=%d algbw_GBps=%f", &r.Rank, &ok, &r.Bytes, &r.TimeUS, &r.AlgBW); err != nil {
			return r, fmt.Errorf("RESULT line %q: %w", l, err)
		}
		r.OK, _ = strconv.ParseBool(ok)
		return r, nil
	}
	return rankResult{}, fmt.Errorf("no RESULT line")
}

// wantVerdict checks what doctor --nccl-log said about a run's log: on
// the socket run, a failure naming NCCL_IB_DISABLE=1; on the IB run, an
// ok "NCCL used network IB" and no failure.
func wantVerdict(checks []doctorCheck, kind string) (string, error) {
	cs := named(checks, "nccl-log")
	for _, c := range cs {
		if kind == "IB" && c.Status == "fail" {
			return "", fmt.Errorf("doctor --nccl-log failed the IB run's log: %s", c)
		}
	}
	for _, c := range cs {
		switch {
		case kind == "Socket" && c.Status == "fail" && strings.Contains(c.Message, "NCCL_IB_DISABLE=1"):
			return c.String(), nil
		case kind == "IB" && c.Status == "ok" && strings.Contains(c.Message, "NCCL used network IB"):
			return c.String(), nil
		}
	}
	return "", fmt.Errorf("doctor --nccl-log on the %s run's log: no verdict naming it; got %v", kind, cs)
}
