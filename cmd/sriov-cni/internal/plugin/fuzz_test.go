package plugin

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecodeState: no input crashes the state parser or is acted on
// unchecked. What it accepts is upgraded to this version, is the VF's own,
// passes the checks teardown relies on, and survives a save and a reload.
func FuzzDecodeState(f *testing.F) {
	vf := "0000:18:00.1"
	for _, s := range []string{
		`{"version":2,"phase":"added","network":"n","containerID":"c","ifName":"net1","pciAddress":"0000:18:00.1","pfNetdev":"ibp24s0",` +
			`"hostName":"ibp24s0v0","vfOrig":{"vlan":0},"vfApplied":["vlan","trust"],"linkMoved":true,"ipamType":"host-local","ipamAdded":true}`,
		`{"version":1,"phase":"adding","network":"n","containerID":"c","ifName":"net1","pciAddress":"0000:18:00.1","hostName":"ibp24s0v0","rdmaDevice":"mlx5_12"}`,
		`{"version":3}`, `{"version":2,"phase":"added"}`, `null`, `[]`, `{"version":2,"vfApplied":["speed"]}`, "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := decodeState(vf, data)
		if err != nil {
			if !errors.Is(err, ErrBadState) {
				t.Fatalf("error without ErrBadState: %v", err)
			}
			return
		}
		if st.Version != StateVersion || st.PCIAddress != vf {
			t.Fatalf("accepted version %d of %q", st.Version, st.PCIAddress)
		}
		if err := st.valid(vf); err != nil {
			t.Fatalf("accepted an invalid state: %v", err)
		}
		if len(st.VFApplied) > 0 && st.VFOrig == nil {
			t.Fatal("settings to restore without their originals")
		}
		again, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		st2, err := decodeState(vf, again)
		if err != nil {
			t.Fatalf("a saved state does not load: %v", err)
		}
		b1, _ := json.Marshal(st2)
		if string(b1) != string(again) {
			t.Fatalf("round trip changed the state:\n%s\n%s", again, b1)
		}
	})
}
