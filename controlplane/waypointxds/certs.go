package waypointxds

import (
	"crypto/tls"
	"slices"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// certificate resolves one certificateRef of an HTTPS listener to the
// certificate chain and key it serves, or the ResolvedRefs condition that
// says why it cannot: RefNotPermitted for a Secret of another namespace
// without a ReferenceGrant there, InvalidCertificateRef for anything but
// a Secret of type kubernetes.io/tls whose tls.crt and tls.key are PEM of
// a certificate chain and its matching private key.
func (g *gatewayBuild) certificate(ref gwv1.SecretObjectReference) (*tlsv3.TlsCertificate, *lcond) {
	bad := func(reason gwv1.ListenerConditionReason, format string, args ...any) (*tlsv3.TlsCertificate, *lcond) {
		c := no(reason, format, args...)
		return nil, &c
	}
	group, kind := "", "Secret"
	if ref.Group != nil {
		group = string(*ref.Group)
	}
	if ref.Kind != nil {
		kind = string(*ref.Kind)
	}
	if (group != "" && group != "core") || kind != "Secret" {
		return bad(gwv1.ListenerReasonInvalidCertificateRef, "certificateRef %s is of group %q kind %s: only Secrets (group \"\", kind Secret) are supported", ref.Name, group, kind)
	}
	ns := g.gw.Namespace
	if ref.Namespace != nil && string(*ref.Namespace) != "" {
		ns = string(*ref.Namespace)
	}
	name := ns + "/" + string(ref.Name)
	if ns != g.gw.Namespace && !g.secretGranted(ns, string(ref.Name)) {
		return bad(gwv1.ListenerReasonRefNotPermitted,
			"certificateRef Secret %s is in another namespace, and no ReferenceGrant there lets Gateways of namespace %s refer to it", name, g.gw.Namespace)
	}
	s := get[corev1.Secret](g.b.st.Secrets, name)
	switch {
	case s == nil:
		return bad(gwv1.ListenerReasonInvalidCertificateRef, "certificateRef Secret %s not found (only Secrets of type %s are read)", name, corev1.SecretTypeTLS)
	case s.Type != corev1.SecretTypeTLS:
		return bad(gwv1.ListenerReasonInvalidCertificateRef, "certificateRef Secret %s is of type %s, not %s", name, s.Type, corev1.SecretTypeTLS)
	}
	crt, key := s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
	if len(crt) == 0 || len(key) == 0 {
		return bad(gwv1.ListenerReasonInvalidCertificateRef, "certificateRef Secret %s lacks %s or %s", name, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
	}
	// The same check the proxy's TLS stack makes: PEM that parses, a
	// certificate first, and a private key that matches its public key.
	if _, err := tls.X509KeyPair(crt, key); err != nil {
		return bad(gwv1.ListenerReasonInvalidCertificateRef, "certificateRef Secret %s holds no usable certificate and key: %v", name, err)
	}
	return &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: crt}},
		PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: key}},
	}, nil
}

// secretGranted reports whether a ReferenceGrant in namespace ns lets
// Gateways of the Gateway's namespace refer to Secret name there: from
// names kind Gateway (group gateway.networking.k8s.io) and that
// namespace, to names Secrets (group "") with that name or no name.
func (g *gatewayBuild) secretGranted(ns, name string) bool {
	for _, o := range byNamespace(g.b.st.ReferenceGrants, ns) {
		rg, ok := o.(*gwv1.ReferenceGrant)
		if !ok || rg.Namespace != ns {
			continue
		}
		from := slices.ContainsFunc(rg.Spec.From, func(f gwv1.ReferenceGrantFrom) bool {
			return f.Group == gwv1.GroupName && f.Kind == "Gateway" && string(f.Namespace) == g.gw.Namespace
		})
		to := slices.ContainsFunc(rg.Spec.To, func(t gwv1.ReferenceGrantTo) bool {
			return (t.Group == "" || t.Group == "core") && t.Kind == "Secret" && (t.Name == nil || *t.Name == "" || string(*t.Name) == name)
		})
		if from && to {
			return true
		}
	}
	return false
}
