package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// creds are the cluster's certificates and keys.
type creds struct {
	ca, front                                   *pki
	apiserver, admin, kcm, scheduler, proxy, fp certFiles
	// kubeletClient is the API server's client certificate towards the
	// kubelets (real-node mode).
	kubeletClient certFiles
	saKey, saPub  string
	// webhookCA signs webhookClient, the certificate the API server
	// presents to webhooks behind Services.
	webhookCA     *pki
	webhookClient certFiles
}

func (c *Cluster) path(parts ...string) string {
	return filepath.Join(append([]string{c.run.dir}, parts...)...)
}

// writePKI makes the cluster CA, the front-proxy CA, every certificate the
// control plane and its clients use, and the service-account key pair.
func (c *Cluster) writePKI() (*creds, error) {
	dir := c.path("pki")
	ca, err := newPKI(dir, "ca")
	if err != nil {
		return nil, err
	}
	front, err := newPKI(dir, "front-proxy-ca")
	if err != nil {
		return nil, err
	}
	wca, err := newPKI(dir, "webhook-client-ca")
	if err != nil {
		return nil, err
	}
	cr := &creds{ca: ca, front: front, webhookCA: wca}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), cpAddr.AsSlice(), kubernetesServiceIP.AsSlice()}
	dns := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	steps := []struct {
		out *certFiles
		fn  func() (certFiles, error)
	}{
		{&cr.apiserver, func() (certFiles, error) { return ca.serving("apiserver", "kube-apiserver", ips, dns) }},
		{&cr.admin, func() (certFiles, error) { return ca.client("admin", "weft-admin", "system:masters") }},
		{&cr.kcm, func() (certFiles, error) {
			return ca.client("kube-controller-manager", "system:kube-controller-manager")
		}},
		{&cr.scheduler, func() (certFiles, error) { return ca.client("kube-scheduler", "system:kube-scheduler") }},
		{&cr.proxy, func() (certFiles, error) { return ca.client("kube-proxy", "system:kube-proxy") }},
		{&cr.fp, func() (certFiles, error) { return front.client("front-proxy-client", "front-proxy-client") }},
		{&cr.webhookClient, func() (certFiles, error) { return wca.client("webhook-client", WebhookClientName) }},
		{&cr.kubeletClient, func() (certFiles, error) {
			return ca.client("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
		}},
	}
	for _, s := range steps {
		if *s.out, err = s.fn(); err != nil {
			return nil, err
		}
	}
	if cr.saKey, cr.saPub, err = serviceAccountKeys(dir); err != nil {
		return nil, err
	}
	return cr, nil
}

// writeKubeconfig writes a kubeconfig for server with a client certificate.
func writeKubeconfig(path, server string, caPEM []byte, cf certFiles) error {
	cert, err := os.ReadFile(cf.cert)
	if err != nil {
		return err
	}
	key, err := os.ReadFile(cf.key)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["weft"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["weft"] = &clientcmdapi.Context{Cluster: "weft", AuthInfo: "admin"}
	cfg.CurrentContext = "weft"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return os.Chmod(path, 0o600)
}

// WebhookClientName is the common name of the client certificate the API
// server presents to admission webhooks behind Services.
const WebhookClientName = "kube-apiserver-webhook-client"

// writeAdmissionConfig writes the API server's admission configuration: both
// webhook plugins read a kubeconfig whose user "*.svc" carries the webhook
// client certificate, so the API server presents it to every webhook behind
// a Service that asks for one. It returns the configuration's path.
func (c *Cluster) writeAdmissionConfig(cf certFiles) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.AuthInfos["*.svc"] = &clientcmdapi.AuthInfo{ClientCertificate: cf.cert, ClientKey: cf.key}
	kubeconfig := c.path("conf", "admission-webhooks.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		return "", fmt.Errorf("writing kubeconfig %s: %w", kubeconfig, err)
	}
	var b strings.Builder
	b.WriteString("apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n")
	for _, plugin := range []string{"ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"} {
		fmt.Fprintf(&b, "- name: %s\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: %s\n",
			plugin, kubeconfig)
	}
	path := c.path("conf", "admission.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// kubeletAPIServerArgs are the API server's authorization and admission
// flags and, in real-node mode, how it reaches the kubelets: by InternalIP,
// checking their serving certificates against the cluster CA and
// presenting a client certificate of its own; kubelets are authorized by
// the Node authorizer and NodeRestriction, as on a real cluster.
func (c *Cluster) kubeletAPIServerArgs(cr *creds) []string {
	if c.cfg.NodeMode != NodeModeKubelet {
		return []string{
			"--authorization-mode=RBAC",
			"--enable-admission-plugins=MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
		}
	}
	return []string{
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-certificate-authority=" + cr.ca.caFile(),
		"--kubelet-client-certificate=" + cr.kubeletClient.cert,
		"--kubelet-client-key=" + cr.kubeletClient.key,
	}
}

// kcmControllers is kube-controller-manager's --controllers flag. The
// harness assigns pod CIDRs itself. With the stand-in no kubelet posts node
// leases: node lifecycle and taint eviction would evict every pod. Real
// kubelets post them and register tainted not-ready, a taint only the node
// lifecycle controller removes.
func (c *Cluster) kcmControllers() string {
	if c.cfg.NodeMode == NodeModeKubelet {
		return "--controllers=*,-node-ipam-controller"
	}
	return "--controllers=*,-node-lifecycle-controller,-taint-eviction-controller,-node-ipam-controller"
}

// startControlPlane starts etcd, kube-apiserver, kube-controller-manager
// and kube-scheduler inside the control-plane namespace and waits for the
// API server to be ready.
func (c *Cluster) startControlPlane(ctx context.Context, cr *creds) error {
	logs := c.path("logs")
	for _, d := range []string{logs, c.path("etcd"), c.path("conf")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	cp := c.topo.cp
	inside := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	for _, k := range []struct {
		name string
		cf   certFiles
	}{{"kube-controller-manager", cr.kcm}, {"kube-scheduler", cr.scheduler}} {
		if err := writeKubeconfig(c.path("conf", k.name+".kubeconfig"), inside, cr.ca.caPEM(), k.cf); err != nil {
			return err
		}
	}
	c.kubeconfig = c.path("admin.kubeconfig")
	if err := writeKubeconfig(c.kubeconfig, "https://"+c.apiAddr, cr.ca.caPEM(), cr.admin); err != nil {
		return err
	}
	if c.cfg.Kubeconfig != "" {
		if err := os.MkdirAll(filepath.Dir(c.cfg.Kubeconfig), 0o755); err != nil {
			return err
		}
		if err := writeKubeconfig(c.cfg.Kubeconfig, "https://"+c.apiAddr, cr.ca.caPEM(), cr.admin); err != nil {
			return err
		}
	}

	c.log.Info("starting etcd", "binary", c.cfg.Etcd)
	var err error
	c.etcd, err = startProcess(cp, "etcd", logs, c.cfg.Etcd, []string{
		"--name=weft", "--data-dir=" + c.path("etcd"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=weft=http://127.0.0.1:2380", "--initial-cluster-state=new",
		"--logger=zap", "--log-level=warn",
	})
	if err != nil {
		return err
	}
	c.track(c.etcd)

	admission, err := c.writeAdmissionConfig(cr.webhookClient)
	if err != nil {
		return err
	}
	c.webhookClientCA = cr.webhookCA.caPEM()
	c.log.Info("starting kube-apiserver", "advertise", cpAddr, "service_cidr", serviceCIDR)
	bin := func(n string) string { return filepath.Join(c.cfg.BinDir, n) }
	c.apiserver, err = startProcess(cp, "kube-apiserver", logs, bin("kube-apiserver"), append([]string{
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=0.0.0.0", fmt.Sprintf("--secure-port=%d", apiPort),
		"--advertise-address=" + cpAddr.String(),
		"--tls-cert-file=" + cr.apiserver.cert, "--tls-private-key-file=" + cr.apiserver.key,
		"--client-ca-file=" + cr.ca.caFile(),
		"--admission-control-config-file=" + admission,
		"--enable-aggregator-routing=true",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + cr.saPub,
		"--service-account-signing-key-file=" + cr.saKey,
		"--service-cluster-ip-range=" + serviceCIDR.String(),
		"--requestheader-client-ca-file=" + cr.front.caFile(),
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-username-headers=X-Remote-User",
		"--proxy-client-cert-file=" + cr.fp.cert, "--proxy-client-key-file=" + cr.fp.key,
		"--allow-privileged=true", "--profiling=false",
		"--cert-dir=" + c.path("conf", "apiserver"),
		"--v=1",
	}, c.kubeletAPIServerArgs(cr)...))
	if err != nil {
		return err
	}
	c.track(c.apiserver)

	c.rest = &rest.Config{
		Host: inside,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: cr.ca.caPEM(), CertFile: cr.admin.cert, KeyFile: cr.admin.key,
		},
		Dial:      c.dialCP,
		QPS:       200,
		Burst:     400,
		UserAgent: "weft-cluster",
	}
	if c.client, err = kubernetes.NewForConfig(c.rest); err != nil {
		return err
	}
	if err := c.poll(ctx, "the API server to be ready", func(ctx context.Context) (bool, string, error) {
		b, err := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return false, strings.TrimSpace(string(b) + " " + err.Error()), nil
		}
		return strings.TrimSpace(string(b)) == "ok", string(b), nil
	}); err != nil {
		return err
	}
	c.log.Info("API server ready")

	c.log.Info("starting kube-controller-manager and kube-scheduler")
	kcmConf := c.path("conf", "kube-controller-manager.kubeconfig")
	c.kcm, err = startProcess(cp, "kube-controller-manager", logs, bin("kube-controller-manager"), []string{
		"--kubeconfig=" + kcmConf, "--authentication-kubeconfig=" + kcmConf, "--authorization-kubeconfig=" + kcmConf,
		"--bind-address=127.0.0.1", "--secure-port=10257", "--leader-elect=false",
		"--service-account-private-key-file=" + cr.saKey, "--root-ca-file=" + cr.ca.caFile(),
		"--cluster-signing-cert-file=" + cr.ca.caFile(), "--cluster-signing-key-file=" + cr.ca.caKeyFile(),
		"--use-service-account-credentials=true",
		c.kcmControllers(),
		"--cert-dir=" + c.path("conf", "kcm"),
		"--v=1",
	})
	if err != nil {
		return err
	}
	c.track(c.kcm)
	schedConf := c.path("conf", "kube-scheduler.kubeconfig")
	c.scheduler, err = startProcess(cp, "kube-scheduler", logs, bin("kube-scheduler"), []string{
		"--kubeconfig=" + schedConf, "--authentication-kubeconfig=" + schedConf, "--authorization-kubeconfig=" + schedConf,
		"--bind-address=127.0.0.1", "--secure-port=10259", "--leader-elect=false",
		"--cert-dir=" + c.path("conf", "scheduler"),
		"--v=1",
	})
	if err != nil {
		return err
	}
	c.track(c.scheduler)
	return nil
}
