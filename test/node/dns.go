package node

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// resolvConf is the pod's /etc/resolv.conf, per its dnsPolicy and
// dnsConfig, as the kubelet writes it. The node has no resolver of its own:
// where the kubelet would copy the node's resolv.conf (dnsPolicy Default, or
// ClusterFirst with hostNetwork) the cluster's nameserver is used, without
// search domains.
func resolvConf(pod *corev1.Pod, dns netip.Addr, domain string) string {
	var servers, search, options []string
	policy := pod.Spec.DNSPolicy
	if policy == "" {
		policy = corev1.DNSClusterFirst
	}
	if policy == corev1.DNSClusterFirst && pod.Spec.HostNetwork {
		policy = corev1.DNSDefault
	}
	switch policy {
	case corev1.DNSClusterFirst, corev1.DNSClusterFirstWithHostNet:
		servers = []string{dns.String()}
		search = []string{pod.Namespace + ".svc." + domain, "svc." + domain, domain}
		options = []string{"ndots:5"}
	case corev1.DNSDefault:
		servers = []string{dns.String()}
	}
	if c := pod.Spec.DNSConfig; c != nil {
		servers = append(servers, c.Nameservers...)
		search = append(search, c.Searches...)
		for _, o := range c.Options {
			if o.Value != nil {
				options = append(options, o.Name+":"+*o.Value)
			} else {
				options = append(options, o.Name)
			}
		}
	}
	var b strings.Builder
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if len(search) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(search, " "))
	}
	if len(options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(options, " "))
	}
	return b.String()
}

// hostsFile is the pod's /etc/hosts, as the kubelet writes it.
func hostsFile(pod *corev1.Pod, ip, hostname string) string {
	var b strings.Builder
	b.WriteString("# Kubernetes-managed hosts file (weft node runner).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	if ip != "" {
		fmt.Fprintf(&b, "%s\t%s\n", ip, hostname)
	}
	for _, a := range pod.Spec.HostAliases {
		fmt.Fprintf(&b, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
	}
	return b.String()
}

// writeNameFiles writes the pod's hosts and resolv.conf files into its dir
// and returns the mounts that put them in place (none for resolv.conf when
// the runner knows no cluster DNS).
func (w *podWorker) writeNameFiles() ([]initMount, error) {
	hostname := w.pod.Name
	if w.pod.Spec.Hostname != "" {
		hostname = w.pod.Spec.Hostname
	}
	if w.pod.Spec.HostNetwork {
		hostname = w.r.cfg.Name
	}
	ip := ""
	if w.ip.IsValid() {
		ip = w.ip.String()
	}
	hosts := filepath.Join(w.dir, "etc-hosts")
	if err := os.WriteFile(hosts, []byte(hostsFile(w.pod, ip, hostname)), 0o644); err != nil {
		return nil, err
	}
	mounts := []initMount{{Source: hosts, Target: "/etc/hosts"}}
	if w.r.cfg.ClusterDNS.IsValid() {
		resolv := filepath.Join(w.dir, "resolv.conf")
		if err := os.WriteFile(resolv, []byte(resolvConf(w.pod, w.r.cfg.ClusterDNS, w.r.cfg.ClusterDomain)), 0o644); err != nil {
			return nil, err
		}
		mounts = append(mounts, initMount{Source: resolv, Target: "/etc/resolv.conf"})
	}
	return mounts, nil
}
