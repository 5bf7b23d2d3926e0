// Package kubeconfig writes and reads the kubeconfig through which the CNI
// plugin reaches the API server: one cluster (server URL and CA bundle) and
// one bearer-token user, the node agent's service-account token. It is
// written as JSON, which is valid kubeconfig YAML, so kubectl reads it too;
// the plugin reads it without the Kubernetes client libraries.
package kubeconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
)

// FileName is the kubeconfig's name in the agent's run directory.
const FileName = "weft-cni-kubeconfig"

// Config is what the plugin needs to call the API server.
type Config struct {
	// Server is the API server's URL, https://host:port.
	Server string
	// CAData is the PEM bundle that verifies the server.
	CAData []byte
	// Token is the bearer token.
	Token string
}

type file struct {
	APIVersion     string         `json:"apiVersion"`
	Kind           string         `json:"kind"`
	Clusters       []namedCluster `json:"clusters"`
	Users          []namedUser    `json:"users"`
	Contexts       []namedContext `json:"contexts"`
	CurrentContext string         `json:"current-context"`
}

type namedCluster struct {
	Name    string `json:"name"`
	Cluster struct {
		Server                   string `json:"server"`
		CertificateAuthorityData []byte `json:"certificate-authority-data,omitempty"`
	} `json:"cluster"`
}

type namedUser struct {
	Name string `json:"name"`
	User struct {
		Token string `json:"token"`
	} `json:"user"`
}

type namedContext struct {
	Name    string `json:"name"`
	Context struct {
		Cluster string `json:"cluster"`
		User    string `json:"user"`
	} `json:"context"`
}

// Validate checks that c can be used.
func (c Config) Validate() error {
	u, err := url.Parse(c.Server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("kubeconfig server %q is not an https URL", c.Server)
	}
	if len(c.CAData) == 0 {
		return errors.New("kubeconfig has no certificate-authority-data")
	}
	if c.Token == "" {
		return errors.New("kubeconfig has no token")
	}
	return nil
}

// Marshal encodes c as a kubeconfig.
func (c Config) Marshal() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	f := file{APIVersion: "v1", Kind: "Config", CurrentContext: "weft-cni"}
	var cl namedCluster
	cl.Name = "local"
	cl.Cluster.Server = c.Server
	cl.Cluster.CertificateAuthorityData = c.CAData
	var us namedUser
	us.Name = "weft-cni"
	us.User.Token = c.Token
	var cx namedContext
	cx.Name = "weft-cni"
	cx.Context.Cluster = "local"
	cx.Context.User = "weft-cni"
	f.Clusters, f.Users, f.Contexts = []namedCluster{cl}, []namedUser{us}, []namedContext{cx}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Parse reads a kubeconfig written by Marshal: its current context's
// cluster and user.
func Parse(b []byte) (Config, error) {
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return Config{}, fmt.Errorf("parsing kubeconfig: %w", err)
	}
	var cx *namedContext
	for i := range f.Contexts {
		if f.Contexts[i].Name == f.CurrentContext {
			cx = &f.Contexts[i]
		}
	}
	if cx == nil {
		return Config{}, fmt.Errorf("parsing kubeconfig: no context %q", f.CurrentContext)
	}
	var c Config
	found := 0
	for _, cl := range f.Clusters {
		if cl.Name == cx.Context.Cluster {
			c.Server, c.CAData = cl.Cluster.Server, cl.Cluster.CertificateAuthorityData
			found++
		}
	}
	for _, u := range f.Users {
		if u.Name == cx.Context.User {
			c.Token = u.User.Token
			found++
		}
	}
	if found != 2 {
		return Config{}, fmt.Errorf("parsing kubeconfig: context %q names a missing cluster or user", cx.Name)
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("parsing kubeconfig: %w", err)
	}
	return c, nil
}

// Read parses the kubeconfig at path.
func Read(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading kubeconfig: %w", err)
	}
	return Parse(b)
}

// Write stores c at path with mode 0600, atomically (a reader sees the old
// or the new file, never a part). It reports whether the file changed.
func Write(path string, c Config) (changed bool, err error) {
	b, err := c.Marshal()
	if err != nil {
		return false, err
	}
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		return false, nil
	}
	if err := WriteFileAtomic(path, b, 0o600); err != nil {
		return false, fmt.Errorf("writing kubeconfig: %w", err)
	}
	return true, nil
}

// WriteFileAtomic writes b to a temporary file in path's directory, syncs
// it and renames it over path.
func WriteFileAtomic(path string, b []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
