package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// volume is a pod volume prepared on the host.
type volume struct {
	path     string
	readOnly bool // configMap, secret, projected and downwardAPI volumes
	netns    bool // a hostPath of the machine's netns directory
}

// tokenFile is a projected service-account token the worker keeps fresh.
type tokenFile struct {
	path      string
	audience  string
	seconds   int64
	mode      os.FileMode
	refreshAt time.Time
}

type volumeSet struct {
	vols   map[string]volume
	tokens []*tokenFile
	// names are /etc/hosts and /etc/resolv.conf, mounted into every
	// container that does not mount something else there.
	names []initMount
}

// passthroughHostPaths are hostPaths that are the machine's own rather than
// mapped under the node's root.
var passthroughHostPaths = []string{"/proc", "/sys", "/dev", "/run/netns", "/var/run/netns"}

// hostPath maps a hostPath volume's path to the machine's path.
func (r *Runner) hostPath(p string) (path string, netnsDir bool) {
	p = filepath.Clean(p)
	for _, pre := range passthroughHostPaths {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			return p, pre == "/run/netns" || pre == "/var/run/netns"
		}
	}
	return filepath.Join(r.cfg.Root, p), false
}

// prepareVolumes makes every pod volume on the host under the pod's dir.
func (w *podWorker) prepareVolumes(ctx context.Context) (*volumeSet, error) {
	vs := &volumeSet{vols: map[string]volume{}}
	var err error
	if vs.names, err = w.writeNameFiles(); err != nil {
		return nil, fmt.Errorf("writing /etc/hosts and /etc/resolv.conf: %w", err)
	}
	for _, v := range w.pod.Spec.Volumes {
		dir := filepath.Join(w.dir, "volumes", v.Name)
		var err error
		switch {
		case v.EmptyDir != nil:
			err = os.MkdirAll(dir, 0o777)
			vs.vols[v.Name] = volume{path: dir}
		case v.HostPath != nil:
			var vol volume
			vol, err = w.prepareHostPath(v.HostPath)
			vs.vols[v.Name] = vol
		case v.ConfigMap != nil:
			err = w.writeConfigMap(ctx, dir, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, mode(v.ConfigMap.DefaultMode, 0o644))
			vs.vols[v.Name] = volume{path: dir, readOnly: true}
		case v.Secret != nil:
			err = w.writeSecret(ctx, dir, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, mode(v.Secret.DefaultMode, 0o644))
			vs.vols[v.Name] = volume{path: dir, readOnly: true}
		case v.DownwardAPI != nil:
			err = w.writeDownwardAPI(dir, v.DownwardAPI.Items, mode(v.DownwardAPI.DefaultMode, 0o644))
			vs.vols[v.Name] = volume{path: dir, readOnly: true}
		case v.Projected != nil:
			err = w.writeProjected(ctx, vs, dir, v.Projected)
			vs.vols[v.Name] = volume{path: dir, readOnly: true}
		default:
			err = errors.New("unsupported volume type (the local cluster supports emptyDir, hostPath, configMap, secret, downwardAPI and projected)")
		}
		if err != nil {
			return nil, fmt.Errorf("volume %q: %w", v.Name, err)
		}
	}
	return vs, nil
}

func mode(m *int32, def os.FileMode) os.FileMode {
	if m == nil {
		return def
	}
	return os.FileMode(*m) & 0o777
}

func (w *podWorker) prepareHostPath(hp *corev1.HostPathVolumeSource) (volume, error) {
	p, netnsDir := w.r.hostPath(hp.Path)
	t := corev1.HostPathUnset
	if hp.Type != nil {
		t = *hp.Type
	}
	st, err := os.Stat(p)
	exists := err == nil
	switch t {
	case corev1.HostPathUnset, corev1.HostPathDirectoryOrCreate:
		// Unset is lenient here: the node's root starts empty, so a missing
		// path is made as a directory.
		if !exists {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return volume{}, err
			}
		}
	case corev1.HostPathFileOrCreate:
		if !exists {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return volume{}, err
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return volume{}, err
			}
			f.Close()
		}
	case corev1.HostPathDirectory:
		if !exists || !st.IsDir() {
			return volume{}, fmt.Errorf("hostPath %s (%s on this node) is not a directory", hp.Path, p)
		}
	default:
		if !exists {
			return volume{}, fmt.Errorf("hostPath %s (%s on this node) does not exist", hp.Path, p)
		}
	}
	if p != filepath.Clean(hp.Path) {
		w.r.addHostPath(filepath.Clean(hp.Path), p)
	}
	return volume{path: p, netns: netnsDir}, nil
}

// writeFile writes data to dir/rel, refusing paths that leave dir.
func writeFile(dir, rel string, data []byte, m os.FileMode) error {
	clean := filepath.Clean(rel)
	if rel == "" || filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") {
		return fmt.Errorf("path %q must be relative and stay inside the volume", rel)
	}
	p := filepath.Join(dir, clean)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, m); err != nil {
		return err
	}
	if err := os.Chmod(tmp, m); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// writeKeys writes data's keys (or the selected items) into dir.
func writeKeys(dir string, data map[string][]byte, items []corev1.KeyToPath, optionalKeys bool, def os.FileMode) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if len(items) == 0 {
		for k, v := range data {
			if err := writeFile(dir, k, v, def); err != nil {
				return err
			}
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optionalKeys {
				continue
			}
			return fmt.Errorf("no key %q", it.Key)
		}
		if err := writeFile(dir, it.Path, v, mode(it.Mode, def)); err != nil {
			return err
		}
	}
	return nil
}

func (w *podWorker) writeConfigMap(ctx context.Context, dir, name string, items []corev1.KeyToPath, opt *bool, m os.FileMode) error {
	cm, err := w.r.cfg.Client.CoreV1().ConfigMaps(w.pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && optional(opt) {
			return os.MkdirAll(dir, 0o755)
		}
		return fmt.Errorf("configMap %q: %w", name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	if err := writeKeys(dir, data, items, optional(opt), m); err != nil {
		return fmt.Errorf("configMap %q: %w", name, err)
	}
	return nil
}

func (w *podWorker) writeSecret(ctx context.Context, dir, name string, items []corev1.KeyToPath, opt *bool, m os.FileMode) error {
	s, err := w.r.cfg.Client.CoreV1().Secrets(w.pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && optional(opt) {
			return os.MkdirAll(dir, 0o755)
		}
		return fmt.Errorf("secret %q: %w", name, err)
	}
	if err := writeKeys(dir, s.Data, items, optional(opt), m); err != nil {
		return fmt.Errorf("secret %q: %w", name, err)
	}
	return nil
}

func (w *podWorker) writeDownwardAPI(dir string, items []corev1.DownwardAPIVolumeFile, def os.FileMode) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil:
			v, err = w.fieldValue(it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			c := &corev1.Container{}
			if len(w.pod.Spec.Containers) > 0 {
				c = &w.pod.Spec.Containers[0]
			}
			v, err = resourceValue(w.pod, c, it.ResourceFieldRef)
		default:
			err = errors.New("downwardAPI item needs fieldRef or resourceFieldRef")
		}
		if err != nil {
			return fmt.Errorf("downwardAPI %q: %w", it.Path, err)
		}
		if err := writeFile(dir, it.Path, []byte(v), mode(it.Mode, def)); err != nil {
			return err
		}
	}
	return nil
}

func (w *podWorker) writeProjected(ctx context.Context, vs *volumeSet, dir string, p *corev1.ProjectedVolumeSource) error {
	def := mode(p.DefaultMode, 0o644)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, src := range p.Sources {
		var err error
		switch {
		case src.ServiceAccountToken != nil:
			t := src.ServiceAccountToken
			secs := int64(3600)
			if t.ExpirationSeconds != nil {
				secs = *t.ExpirationSeconds
			}
			tf := &tokenFile{path: filepath.Join(dir, t.Path), audience: t.Audience, seconds: secs, mode: def}
			if err = w.writeToken(ctx, tf); err == nil {
				vs.tokens = append(vs.tokens, tf)
			}
		case src.ConfigMap != nil:
			err = w.writeConfigMap(ctx, dir, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional, def)
		case src.Secret != nil:
			err = w.writeSecret(ctx, dir, src.Secret.Name, src.Secret.Items, src.Secret.Optional, def)
		case src.DownwardAPI != nil:
			err = w.writeDownwardAPI(dir, src.DownwardAPI.Items, def)
		case src.ClusterTrustBundle != nil, src.PodCertificate != nil:
			err = errors.New("unsupported projected source (clusterTrustBundle, podCertificate)")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// writeToken requests a token bound to the pod through the TokenRequest API
// and writes it, scheduling its refresh at 80% of its lifetime as the
// kubelet does.
func (w *podWorker) writeToken(ctx context.Context, tf *tokenFile) error {
	sa := w.pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &tf.seconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: w.pod.Name, UID: w.pod.UID},
	}}
	if tf.audience != "" {
		req.Spec.Audiences = []string{tf.audience}
	}
	tr, err := w.r.cfg.Client.CoreV1().ServiceAccounts(w.pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("requesting a token for service account %q: %w", sa, err)
	}
	if err := writeFile(filepath.Dir(tf.path), filepath.Base(tf.path), []byte(tr.Status.Token), tf.mode); err != nil {
		return err
	}
	life := time.Until(tr.Status.ExpirationTimestamp.Time)
	if life <= 0 || life > time.Duration(tf.seconds)*time.Second {
		life = time.Duration(tf.seconds) * time.Second
	}
	tf.refreshAt = time.Now().Add(life * 8 / 10)
	return nil
}

// refresh renews tokens that are due and returns when the next one is.
func (vs *volumeSet) refresh(ctx context.Context, w *podWorker) time.Time {
	var next time.Time
	for _, tf := range vs.tokens {
		if time.Now().After(tf.refreshAt) {
			if err := w.writeToken(ctx, tf); err != nil {
				w.log.Warn("token refresh failed", "path", tf.path, "err", err)
				tf.refreshAt = time.Now().Add(10 * time.Second)
			}
		}
		if next.IsZero() || tf.refreshAt.Before(next) {
			next = tf.refreshAt
		}
	}
	return next
}
