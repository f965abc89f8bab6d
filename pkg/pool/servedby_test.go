package pool_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

func TestServedBy(t *testing.T) {
	cfg, err := pool.Load(seed("dra.json"))
	require.NoError(t, err)
	require.Len(t, cfg.Resources, 2)
	require.Equal(t, pool.ServedByDevicePlugin, cfg.Resources[0].ServedBy, "a configList pool is always the device plugin's")
	require.Equal(t, pool.ServedByDRA, cfg.Resources[1].ServedBy)

	cfg, err = pool.Load(seed("combined.json"))
	require.NoError(t, err)
	for _, r := range cfg.Resources {
		require.Equal(t, pool.ServedByDevicePlugin, r.ServedBy, "%s: the default", r.ResourceName())
	}

	for _, v := range []string{"devicePlugin", "deviceplugin", ""} {
		cfg, err := pool.Parse([]byte(`{"resourceList":[{"resourceName":"x","servedBy":"` + v + `","selectors":{"vendors":["15b3"]}}]}`))
		require.NoError(t, err, v)
		require.Equal(t, pool.ServedByDevicePlugin, cfg.Resources[0].ServedBy, v)
	}
}

func TestServedByErrors(t *testing.T) {
	long := strings.Repeat("a", 60)
	for _, tc := range []struct{ name, conf, want string }{
		{"unknown API", `{"resourceList":[{"resourceName":"x","servedBy":"cdi","selectors":{"vendors":["15b3"]}}]}`,
			`resourceList[0].servedBy: "cdi": want "devicePlugin" (the kubelet device plugin API, the default) or "dra" (Dynamic Resource Allocation)`},
		{"not a string", `{"resourceList":[{"resourceName":"x","servedBy":true,"selectors":{"vendors":["15b3"]}}]}`,
			`resourceList[0].servedBy: want a string, got a boolean`},
		{"shared pool", `{"configList":[{"resourceName":"x","rdmaHcaMax":2,"servedBy":"dra","selectors":{"vendors":["15b3"]}}]}`,
			`servedBy applies to resourceList (exclusive) pools`},
		{"name too long for an attribute", `{"resourceList":[{"resourceName":"` + long + `","servedBy":"dra","selectors":{"vendors":["15b3"]}}]}`,
			`resource name "mellanox.com/` + long + `" is 73 bytes long: a pool served by DRA publishes it as a device attribute, at most 64 bytes`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pool.Parse([]byte(tc.conf))
			require.ErrorContains(t, err, tc.want)
		})
	}
	// The same long name is fine for the device plugin.
	_, err := pool.Parse([]byte(`{"resourceList":[{"resourceName":"` + long + `","selectors":{"vendors":["15b3"]}}]}`))
	require.NoError(t, err)
}
