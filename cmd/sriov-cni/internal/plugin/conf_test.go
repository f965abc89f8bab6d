package plugin

import (
	"errors"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

func TestParseConfValid(t *testing.T) {
	c, err := parseConf([]byte(`{"cniVersion":"0.3.1","name":"sriov-rdma","type":"sriov",
		"deviceID":"0000:18:00.1","vlan":100,"vlanQoS":3,"vlanProto":"802.1ad","mac":"02:00:00:00:00:01",
		"mtu":9000,"spoofchk":"off","trust":"on","link_state":"enable","min_tx_rate":100,"max_tx_rate":1000,
		"runtimeConfig":{"mac":"02:00:00:00:00:02","CNIDeviceInfoFile":"/var/run/k8s.cni.cncf.io/devinfo/cni/x.json"},
		"ipam":{"type":"whereabouts","range":"192.168.100.0/24"}}`))
	require.NoError(t, err)
	require.Equal(t, "0000:18:00.1", c.deviceID())
	v := c.vf
	require.Equal(t, 100, *v.Vlan)
	require.Equal(t, 3, *v.VlanQoS)
	require.Equal(t, sriov.VlanProto8021AD, *v.VlanProto)
	require.Equal(t, "02:00:00:00:00:02", v.MAC.String(), "runtimeConfig.mac wins over mac")
	require.False(t, *v.SpoofChk)
	require.True(t, *v.Trust)
	require.Equal(t, uint32(sriov.LinkStateEnable), *v.LinkState)
	require.True(t, v.Any())

	// Multus' pciBusID and runtimeConfig.deviceID are deviceIDs too.
	c, err = parseConf([]byte(`{"name":"n","type":"sriov","pciBusID":"0000:18:00.2"}`))
	require.NoError(t, err)
	require.Equal(t, "0000:18:00.2", c.deviceID())
	c, err = parseConf([]byte(`{"name":"n","type":"sriov","deviceID":"0000:18:00.2","runtimeConfig":{"deviceID":"0000:18:00.3"}}`))
	require.NoError(t, err)
	require.Equal(t, "0000:18:00.3", c.deviceID())
	require.False(t, c.vf.Any())

	c, err = parseConf([]byte(`{"name":"n","type":"sriov","guid":"00:11:22:33:44:55:66:77"}`))
	require.NoError(t, err)
	require.Equal(t, "00:11:22:33:44:55:66:77", c.vf.GUID.String())
}

func TestParseConfInvalid(t *testing.T) {
	for _, tc := range []struct{ name, conf, want string }{
		{"not json", `{`, "parse network configuration"},
		{"other type", `{"name":"n","type":"macvlan"}`, `type "macvlan"`},
		{"deviceID not PCI", `{"name":"n","type":"sriov","deviceID":"../../etc"}`, `deviceID "../../etc": not a PCI address`},
		{"deviceID upper case", `{"name":"n","type":"sriov","deviceID":"0000:3B:00.1"}`, "not a PCI address"},
		{"runtime deviceID", `{"name":"n","runtimeConfig":{"deviceID":"18:00.1"}}`, "runtimeConfig.deviceID"},
		{"vlan range", `{"name":"n","vlan":4095}`, "vlan 4095: want 0-4094"},
		{"vlan negative", `{"name":"n","vlan":-1}`, "vlan -1"},
		{"qos range", `{"name":"n","vlan":1,"vlanQoS":8}`, "vlanQoS 8: want 0-7"},
		{"qos without vlan", `{"name":"n","vlanQoS":2}`, "vlanQoS 2 needs a non-zero vlan"},
		{"qos with vlan 0", `{"name":"n","vlan":0,"vlanQoS":2}`, "needs a non-zero vlan"},
		{"proto", `{"name":"n","vlan":1,"vlanProto":"802.1x"}`, `vlanProto "802.1x"`},
		{"qinq without vlan", `{"name":"n","vlanProto":"802.1ad"}`, "802.1ad needs a non-zero vlan"},
		{"mac", `{"name":"n","mac":"zz:00:00:00:00:00"}`, `mac "zz:00:00:00:00:00"`},
		{"mac multicast", `{"name":"n","mac":"01:00:5e:00:00:01"}`, "multicast"},
		{"runtime mac", `{"name":"n","runtimeConfig":{"mac":"nope"}}`, "runtimeConfig.mac"},
		{"trust yes", `{"name":"n","trust":"yes"}`, `trust "yes": want "on" or "off"`},
		{"trust true", `{"name":"n","trust":"true"}`, `trust "true"`},
		{"spoofchk", `{"name":"n","spoofchk":"ON"}`, `spoofchk "ON"`},
		{"link state", `{"name":"n","link_state":"up"}`, `link_state "up": want auto, enable or disable`},
		{"rates", `{"name":"n","min_tx_rate":200,"max_tx_rate":100}`, "min_tx_rate 200 is above max_tx_rate 100"},
		{"negative rate", `{"name":"n","max_tx_rate":-5}`, "max_tx_rate -5"},
		{"guid short", `{"name":"n","guid":"00:11:22:33:44:55"}`, "not an InfiniBand GUID"},
		{"guid zero", `{"name":"n","runtimeConfig":{"infinibandGUID":"00:00:00:00:00:00:00:00"}}`, "zero GUID"},
		{"ib-sriov type", `{"name":"n","type":"ib-sriov"}`, `type "ib-sriov": this plugin is "sriov" (a NetworkAttachmentDefinition written for ib-sriov-cni works with "type": "sriov")`},
		{"pkey", `{"name":"n","type":"sriov","pkey":"0x8001"}`, `pkey "0x8001": this plugin does not set InfiniBand partition keys`},
		{"mtu", `{"name":"n","mtu":20}`, "mtu 20: want 68-65535"},
		{"resource", `{"name":"n","resourceName":"mlnx_sriov_rdma"}`, "want <prefix>/<name>"},
		{"devinfo", `{"name":"n","runtimeConfig":{"CNIDeviceInfoFile":"x.json"}}`, "CNIDeviceInfoFile"},
		{"log level", `{"name":"n","logLevel":"loud"}`, `logLevel "loud"`},
		{"log file relative", `{"name":"n","logFile":"sriov.log"}`, `logFile "sriov.log": want an absolute path`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConf([]byte(tc.conf))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			var te *types.Error
			require.True(t, errors.As(err, &te))
			require.Equal(t, types.ErrInvalidNetworkConfig, te.Code)
		})
	}
}

func FuzzParseConf(f *testing.F) {
	f.Add([]byte(`{"name":"n","type":"sriov","deviceID":"0000:18:00.1","vlan":5,"vlanQoS":1,"mac":"02:00:00:00:00:01"}`))
	f.Add([]byte(`{"name":"n","guid":"00:11:22:33:44:55:66:77","min_tx_rate":1,"max_tx_rate":0}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseConf(data)
		if err != nil {
			var te *types.Error
			if !errors.As(err, &te) || te.Code != types.ErrInvalidNetworkConfig {
				t.Fatalf("error without code 7: %v", err)
			}
			return
		}
		if id := c.deviceID(); id != "" && len(id) != 12 {
			t.Fatalf("accepted deviceID %q", id)
		}
	})
}
