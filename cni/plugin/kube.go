package plugin

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/weftmesh/weft/cni/enablement"
	"github.com/weftmesh/weft/cni/kubeconfig"
)

// apiTimeout bounds the plugin's API lookups.
const apiTimeout = 5 * time.Second

// errNotFound is the API's 404.
var errNotFound = errors.New("not found")

// apiClient reads pods and namespaces with two GETs, nothing more: the
// plugin must stay cheap for the pods it does not touch.
type apiClient struct {
	base  *url.URL
	token string
	hc    *http.Client
}

func newAPIClient(kc kubeconfig.Config) (*apiClient, error) {
	base, err := url.Parse(kc.Server)
	if err != nil {
		return nil, fmt.Errorf("API server URL: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(kc.CAData) {
		return nil, errors.New("the kubeconfig's certificate-authority-data holds no PEM certificate")
	}
	return &apiClient{base: base, token: kc.Token, hc: &http.Client{
		Timeout: apiTimeout,
		// One connection (HTTP/2 where the server speaks it) carries both
		// lookups: a single TLS handshake per ADD.
		Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2:   true,
			MaxConnsPerHost:     1,
			MaxIdleConnsPerHost: 1,
			DisableCompression:  true,
		},
	}}, nil
}

// objectMeta, podObject and namespaceObject are the parts of the API's
// JSON the decision reads.
type objectMeta struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type podObject struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		HostNetwork bool `json:"hostNetwork"`
	} `json:"spec"`
}

type namespaceObject struct {
	Metadata objectMeta `json:"metadata"`
}

func (c *apiClient) get(ctx context.Context, path string, v any) error {
	u := c.base.JoinPath(path)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body := io.LimitReader(resp.Body, 4<<20)
	switch {
	case resp.StatusCode == http.StatusNotFound:
		io.Copy(io.Discard, body)
		return errNotFound
	case resp.StatusCode != http.StatusOK:
		msg, _ := io.ReadAll(io.LimitReader(body, 512))
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, msg)
	}
	if err := json.NewDecoder(body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: decoding: %w", path, err)
	}
	io.Copy(io.Discard, body)
	return nil
}

// PodAndNamespace fetches what the enablement decision needs, both lookups
// at once.
func (c *apiClient) PodAndNamespace(ctx context.Context, ns, name string) (enablement.Pod, map[string]string, error) {
	var nsObj namespaceObject
	nsErr := make(chan error, 1)
	go func() { nsErr <- c.get(ctx, "/api/v1/namespaces/"+url.PathEscape(ns), &nsObj) }()
	var pod podObject
	podErr := c.get(ctx, "/api/v1/namespaces/"+url.PathEscape(ns)+"/pods/"+url.PathEscape(name), &pod)
	if err := <-nsErr; err != nil {
		return enablement.Pod{}, nil, fmt.Errorf("getting namespace %s: %w", ns, err)
	}
	if podErr != nil {
		return enablement.Pod{}, nil, fmt.Errorf("getting pod %s/%s: %w", ns, name, podErr)
	}
	return enablement.Pod{Labels: pod.Metadata.Labels, Annotations: pod.Metadata.Annotations, HostNetwork: pod.Spec.HostNetwork}, nsObj.Metadata.Labels, nil
}

func (c *apiClient) close() { c.hc.CloseIdleConnections() }
