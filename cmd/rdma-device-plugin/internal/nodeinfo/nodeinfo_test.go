package nodeinfo

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testCA is a certificate authority of the test's own, as a cluster's.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// serverCert is a certificate for 127.0.0.1 signed by ca.
func (ca *testCA) serverCert(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// apiServer serves h over TLS with a certificate of ca.
func apiServer(t *testing.T, ca *testCA, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.serverCert(t)}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// serviceAccount writes a pod's token and ca.crt into a directory.
func serviceAccount(t *testing.T, ca *testCA, token string) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ca.crt"), ca.pem, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "token"), []byte(token+"\n"), 0o600))
	return dir
}

// inCluster is the client a pod whose environment names srv has.
func inCluster(t *testing.T, srv *httptest.Server, saDir string, timeout time.Duration) *Client {
	t.Helper()
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	env := map[string]string{"KUBERNETES_SERVICE_HOST": u.Hostname(), "KUBERNETES_SERVICE_PORT": u.Port()}
	c, err := InCluster(func(k string) string { return env[k] }, saDir, timeout)
	require.NoError(t, err)
	return c
}

const nodeA = `{"kind":"Node","apiVersion":"v1","metadata":{"name":"node-a","labels":{"kubernetes.io/hostname":"node-a","feature.node.kubernetes.io/network-sriov.capable":"true"}},"status":{}}`

func TestLabels(t *testing.T) {
	ca := newCA(t)
	for _, tc := range []struct {
		name    string
		node    string
		status  int
		body    string
		want    map[string]string
		wantIs  error
		wantErr []string // in the message
	}{
		{name: "labels", node: "node-a", status: 200, body: nodeA,
			want: map[string]string{"kubernetes.io/hostname": "node-a", "feature.node.kubernetes.io/network-sriov.capable": "true"}},
		{name: "no labels", node: "node-b", status: 200, body: `{"kind":"Node","metadata":{"name":"node-b"}}`, want: map[string]string{}},
		{name: "RBAC missing", node: "node-a", status: 403,
			body:   `{"kind":"Status","status":"Failure","message":"nodes \"node-a\" is forbidden: User \"system:serviceaccount:fastpath:rdma-device-plugin\" cannot get resource \"nodes\"","reason":"Forbidden","code":403}`,
			wantIs: ErrForbidden, wantErr: []string{"node-a", "RBAC get on nodes", "cannot get resource"}},
		{name: "no such node", node: "node-x", status: 404, body: `{"kind":"Status","message":"nodes \"node-x\" not found","code":404}`,
			wantIs: ErrNotFound, wantErr: []string{`no node named "node-x"`, "spec.nodeName"}},
		{name: "token refused", node: "node-a", status: 401, body: `{"kind":"Status","message":"Unauthorized","code":401}`,
			wantIs: ErrUnauthorized, wantErr: []string{"token"}},
		{name: "server error", node: "node-a", status: 500, body: `oops`, wantErr: []string{"500 Internal Server Error"}},
		{name: "bad JSON", node: "node-a", status: 200, body: `{"kind":"Node","metadata":`, wantErr: []string{"decode the answer"}},
		{name: "labels not a map", node: "node-a", status: 200, body: `{"kind":"Node","metadata":{"name":"node-a","labels":["a"]}}`, wantErr: []string{"decode the answer"}},
		{name: "not a Node", node: "node-a", status: 200, body: `{"kind":"Status","metadata":{}}`, wantErr: []string{"not that Node"}},
		{name: "another node", node: "node-a", status: 200, body: `{"kind":"Node","metadata":{"name":"node-b","labels":{}}}`, wantErr: []string{`name "node-b"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := apiServer(t, ca, func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodGet || r.URL.Path != "/api/v1/nodes/"+tc.node || r.Header.Get("Authorization") != "Bearer tok-1" {
					http.Error(w, "unexpected request "+r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"), http.StatusTeapot)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			})
			c := inCluster(t, srv, serviceAccount(t, ca, "tok-1"), 0)
			got, err := c.Labels(context.Background(), tc.node)
			if tc.want != nil {
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
				return
			}
			require.Error(t, err)
			require.Nil(t, got)
			if tc.wantIs != nil {
				require.ErrorIs(t, err, tc.wantIs)
			}
			for _, s := range tc.wantErr {
				require.ErrorContains(t, err, s)
			}
		})
	}
}

// The kubelet rotates a projected token: each request reads the file.
func TestLabelsTokenRotates(t *testing.T) {
	ca := newCA(t)
	seen := make(chan string, 2)
	srv := apiServer(t, ca, func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("Authorization")
		_, _ = w.Write([]byte(nodeA))
	})
	sa := serviceAccount(t, ca, "tok-1")
	c := inCluster(t, srv, sa, 0)
	_, err := c.Labels(context.Background(), "node-a")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(sa, "token"), []byte("tok-2"), 0o600))
	_, err = c.Labels(context.Background(), "node-a")
	require.NoError(t, err)
	require.Equal(t, "Bearer tok-1", <-seen)
	require.Equal(t, "Bearer tok-2", <-seen)
}

// Only the cluster's CA is trusted: a server with a certificate of
// another CA is refused before any token is sent.
func TestLabelsOtherCA(t *testing.T) {
	var sent atomic.Bool
	srv := apiServer(t, newCA(t), func(w http.ResponseWriter, r *http.Request) {
		sent.Store(true)
		_, _ = w.Write([]byte(nodeA))
	})
	c := inCluster(t, srv, serviceAccount(t, newCA(t), "tok-1"), 0)
	_, err := c.Labels(context.Background(), "node-a")
	var unknown x509.UnknownAuthorityError
	require.ErrorAs(t, err, &unknown)
	require.False(t, sent.Load())
}

// A server that never answers costs the timeout, not forever.
func TestLabelsTimeout(t *testing.T) {
	ca := newCA(t)
	release := make(chan struct{})
	// The handler never answers before the test ends: one that returned
	// when its request's context ended could answer an empty 200 first
	// (the server ends that context on its own reading of the connection).
	srv := apiServer(t, ca, func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	t.Cleanup(func() { close(release) }) // before srv.Close (cleanups run last-in first-out)
	c := inCluster(t, srv, serviceAccount(t, ca, "tok-1"), 200*time.Millisecond)
	start := time.Now()
	_, err := c.Labels(context.Background(), "node-a")
	require.Error(t, err)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "a timeout error: %v", err)
	require.Less(t, time.Since(start), 5*time.Second)

	// The caller's context bounds it too.
	c = inCluster(t, srv, serviceAccount(t, ca, "tok-1"), time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = c.Labels(ctx, "node-a")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestInCluster(t *testing.T) {
	ca := newCA(t)
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	inPod := env(map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"})

	_, err := InCluster(env(nil), serviceAccount(t, ca, "tok"), 0)
	require.ErrorIs(t, err, ErrNotInCluster)
	_, err = InCluster(env(map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1"}), serviceAccount(t, ca, "tok"), 0)
	require.ErrorIs(t, err, ErrNotInCluster)

	c, err := InCluster(inPod, serviceAccount(t, ca, "tok"), 0)
	require.NoError(t, err)
	require.Equal(t, "https://10.96.0.1:443", c.server)
	v6, err := InCluster(env(map[string]string{"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}), serviceAccount(t, ca, "tok"), 0)
	require.NoError(t, err)
	require.Equal(t, "https://[fd00::1]:443", v6.server)

	// No token mounted (automountServiceAccountToken: false).
	_, err = InCluster(inPod, t.TempDir(), 0)
	require.ErrorContains(t, err, "automountServiceAccountToken")
	sa := serviceAccount(t, ca, "tok")
	require.NoError(t, os.Remove(filepath.Join(sa, "token")))
	_, err = InCluster(inPod, sa, 0)
	require.ErrorContains(t, err, "service account token")
	require.ErrorIs(t, err, os.ErrNotExist)
	sa = serviceAccount(t, ca, "")
	_, err = InCluster(inPod, sa, 0)
	require.ErrorContains(t, err, "is empty")
	sa = serviceAccount(t, ca, "tok")
	require.NoError(t, os.WriteFile(filepath.Join(sa, "ca.crt"), []byte("not a certificate"), 0o644))
	_, err = InCluster(inPod, sa, 0)
	require.ErrorContains(t, err, "no PEM certificate")

	_, err = New("http://10.96.0.1:443", filepath.Join(sa, "token"), filepath.Join(sa, "ca.crt"), 0)
	require.ErrorContains(t, err, "want https://host:port")
	_, err = c.Labels(context.Background(), "../secrets")
	require.ErrorContains(t, err, "not a node name")
}
