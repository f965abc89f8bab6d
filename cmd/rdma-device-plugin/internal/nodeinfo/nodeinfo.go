// Package nodeinfo reads this node's labels from the Kubernetes API
// server with the pod's service account: one GET of /api/v1/nodes/NAME
// over HTTPS, with net/http and encoding/json only. The lean device
// plugin build (-tags nodra) links no Kubernetes client library, and a
// node's labels are all provisioning asks of the API.
package nodeinfo

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ServiceAccountDir is where the kubelet mounts a pod's service account
// token and the cluster's CA (automountServiceAccountToken).
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// DefaultTimeout bounds one request, connection and body included.
const DefaultTimeout = 10 * time.Second

// maxBody bounds what is read of an answer: a Node object is a few KiB.
const maxBody = 4 << 20

var (
	// ErrNotInCluster: the process does not run in a pod (no
	// KUBERNETES_SERVICE_HOST/PORT in its environment).
	ErrNotInCluster = errors.New("not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
	// ErrUnauthorized: the API server did not accept the token (401).
	ErrUnauthorized = errors.New("unauthorized (401)")
	// ErrForbidden: the service account may not get the node (403).
	ErrForbidden = errors.New("forbidden (403)")
	// ErrNotFound: there is no node of that name (404).
	ErrNotFound = errors.New("not found (404)")
)

// Client gets Node objects from one API server.
type Client struct {
	server    string // https://host:port
	tokenFile string
	http      *http.Client
}

// InCluster is the client of a process in a pod: the API server from
// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT (read through
// getenv), the token and the CA (ca.crt) in saDir. ErrNotInCluster when
// the environment names no API server.
func InCluster(getenv func(string) string, saDir string, timeout time.Duration) (*Client, error) {
	host, port := getenv("KUBERNETES_SERVICE_HOST"), getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, ErrNotInCluster
	}
	return New("https://"+net.JoinHostPort(host, port), filepath.Join(saDir, "token"), filepath.Join(saDir, "ca.crt"), timeout)
}

// New is a client of server (https://host:port) that trusts only the CA
// certificates in caFile and sends the bearer token in tokenFile, read
// again for each request (the kubelet rotates projected tokens). A
// timeout of 0 is DefaultTimeout. No proxy is used: the API server's
// service address is inside the cluster.
func New(server, tokenFile, caFile string, timeout time.Duration) (*Client, error) {
	u, err := url.Parse(server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("API server %q: want https://host:port", server)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read the cluster CA: %w (is automountServiceAccountToken on for the pod?)", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("cluster CA %s: no PEM certificate in it", caFile)
	}
	if _, err := readToken(tokenFile); err != nil {
		return nil, err
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	tr := &http.Transport{
		TLSClientConfig:       &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		DialContext:           (&net.Dialer{Timeout: timeout}).DialContext,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		ForceAttemptHTTP2:     true,
	}
	return &Client{server: strings.TrimSuffix(server, "/"), tokenFile: tokenFile, http: &http.Client{Transport: tr, Timeout: timeout}}, nil
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read the service account token: %w (is automountServiceAccountToken on for the pod?)", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("service account token %s is empty", path)
	}
	return tok, nil
}

// node is the part of a Node object read here.
type node struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
}

// Labels returns the labels of the node name; a node without labels
// gives an empty, non-nil map.
func (c *Client) Labels(ctx context.Context, name string) (map[string]string, error) {
	if name == "" || strings.ContainsAny(name, "/?#%") {
		return nil, fmt.Errorf("get node %q: not a node name", name)
	}
	tok, err := readToken(c.tokenFile)
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", name, err)
	}
	u := c.server + "/api/v1/nodes/" + url.PathEscape(name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", name, err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "fastpath-rdma-device-plugin")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get node %s from %s: %w", name, c.server, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("get node %s from %s: read the answer: %w", name, c.server, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(name, resp.StatusCode, body)
	}
	var n node
	if err := json.Unmarshal(body, &n); err != nil {
		return nil, fmt.Errorf("get node %s: decode the answer: %w", name, err)
	}
	if n.Kind != "Node" || n.Metadata.Name != name {
		return nil, fmt.Errorf("get node %s: the answer is not that Node (kind %q, name %q)", name, n.Kind, n.Metadata.Name)
	}
	if n.Metadata.Labels == nil {
		return map[string]string{}, nil
	}
	return n.Metadata.Labels, nil
}

// statusError turns an answer other than 200 into an error that says
// what to do; the API server's own message (a Status object) is kept.
func statusError(name string, code int, body []byte) error {
	var st struct {
		Message string `json:"message"`
	}
	msg := ""
	if json.Unmarshal(body, &st) == nil && st.Message != "" {
		msg = ": " + st.Message
	}
	switch code {
	case http.StatusUnauthorized:
		return fmt.Errorf("get node %s: %w: the API server did not accept the service account token%s", name, ErrUnauthorized, msg)
	case http.StatusForbidden:
		return fmt.Errorf("get node %s: %w: the service account needs RBAC get on nodes (a ClusterRole and its binding, as deployments/components/provision has)%s", name, ErrForbidden, msg)
	case http.StatusNotFound:
		return fmt.Errorf("get node %s: %w: no node named %q (NODE_NAME should be the pod's spec.nodeName, from the downward API)%s", name, ErrNotFound, name, msg)
	}
	return fmt.Errorf("get node %s: the API server answered %d %s%s", name, code, http.StatusText(code), msg)
}
