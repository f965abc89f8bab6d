package main

import (
	"context"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/provisioner"
	"github.com/fastpath-k8s/fastpath/internal/version"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// fakeAPIServer answers GET /api/v1/nodes/node-a with the node's
// labels, or with status; env is a pod's that reaches it, its service
// account directory holding the server's CA and a token.
func fakeAPIServer(t *testing.T, status int, labels string) nodeEnv {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/nodes/node-a" || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "unexpected request", http.StatusTeapot)
			return
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"kind":"Node","metadata":{"name":"node-a","labels":`+labels+`}}`)
	}))
	t.Cleanup(srv.Close)
	sa := t.TempDir()
	// httptest's certificate is its own CA.
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	require.NoError(t, os.WriteFile(filepath.Join(sa, "ca.crt"), ca, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(sa, "token"), []byte("tok"), 0o600))
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	env := map[string]string{"KUBERNETES_SERVICE_HOST": u.Hostname(), "KUBERNETES_SERVICE_PORT": u.Port()}
	return nodeEnv{getenv: func(k string) string { return env[k] }, saDir: sa, timeout: 5 * time.Second}
}

const seedLabels = `{"feature.node.kubernetes.io/network-sriov.capable":"true","kubernetes.io/hostname":"node-a"}`

func TestResolveNodeLabels(t *testing.T) {
	notInPod := nodeEnv{getenv: func(string) string { return "" }, saDir: t.TempDir()}
	for _, tc := range []struct {
		name    string
		flags   nodeFlags
		env     nodeEnv
		want    map[string]string
		wantErr string // NodeLabels.Err: unreadable
	}{
		{name: "--node-labels wins", flags: nodeFlags{labels: "a=b, c=d", name: "node-a"}, env: fakeAPIServer(t, 200, seedLabels),
			want: map[string]string{"a": "b", "c": "d"}},
		{name: "from the API server", flags: nodeFlags{name: "node-a"}, env: fakeAPIServer(t, 200, seedLabels),
			want: map[string]string{"feature.node.kubernetes.io/network-sriov.capable": "true", "kubernetes.io/hostname": "node-a"}},
		{name: "a node without labels", flags: nodeFlags{name: "node-a"}, env: fakeAPIServer(t, 200, `{}`), want: map[string]string{}},
		{name: "no node name: unknown", flags: nodeFlags{}, env: fakeAPIServer(t, 200, seedLabels)},
		{name: "not in a pod: unknown", flags: nodeFlags{name: "node-a"}, env: notInPod},
		{name: "RBAC missing", flags: nodeFlags{name: "node-a"}, env: fakeAPIServer(t, 403, `{}`), wantErr: "RBAC get on nodes"},
		{name: "no token", flags: nodeFlags{name: "node-a"},
			env: nodeEnv{getenv: func(k string) string {
				return map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}[k]
			}, saDir: t.TempDir()},
			wantErr: "automountServiceAccountToken"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nl, err := tc.flags.resolve(context.Background(), tc.env)
			require.NoError(t, err)
			require.Equal(t, tc.want, nl.Labels)
			require.NotEmpty(t, nl.Source)
			if tc.wantErr == "" {
				require.NoError(t, nl.Err)
				return
			}
			require.ErrorContains(t, nl.Err, "node node-a: labels")
			require.ErrorContains(t, nl.Err, tc.wantErr)
		})
	}
	_, err := nodeFlags{labels: "a"}.resolve(context.Background(), notInPod)
	require.ErrorContains(t, err, `--node-labels: "a" is not key=value`)
}

// The provisioner matches the seed's nodeSelector against the labels the
// API server has for its node; labels it cannot read leave the policy
// out and the PF to a later try.
func TestProvisionNodeSelectorFromAPI(t *testing.T) {
	host := provisionedHost(t)
	ps, err := provision.Load(seedPolicy())
	require.NoError(t, err)
	metrics := plugin.NewMetrics(version.Get())
	for _, tc := range []struct {
		name        string
		env         nodeEnv
		pfs         int
		pending     bool
		wantWarning string
	}{
		{"selected", fakeAPIServer(t, 200, seedLabels), 8, false, ""},
		{"not selected", fakeAPIServer(t, 200, `{"kubernetes.io/hostname":"node-a"}`), 0, false, "does not match this node's labels"},
		{"RBAC missing", fakeAPIServer(t, 403, `{}`), 0, true, "this node's labels are unknown: node node-a: labels: get node node-a: forbidden (403)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := provisionFlags{Config: provisioner.Config{StateDir: t.TempDir()}, node: nodeFlags{name: "node-a"}}
			p := f.newProvisioner(host, "", nil, slog.New(slog.DiscardHandler), tc.env)
			p.Policies = ps
			plan, _, pending := p.Once(context.Background(), metrics)
			require.Len(t, plan.PFs, tc.pfs)
			require.Zero(t, plan.Changes(), "the host has the seed's VFs")
			require.Equal(t, tc.pending, pending, "retried until the labels can be read")
			if tc.wantWarning != "" {
				require.Len(t, plan.Warnings, 1)
				require.Contains(t, plan.Warnings[0], tc.wantWarning)
			}
		})
	}
}
