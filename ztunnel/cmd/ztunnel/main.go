// Command ztunnel is Weft's node L4 proxy (a DaemonSet): it carries every
// enrolled pod's TCP traffic over HBONE, enforcing L4 policy.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/weftmesh/weft/internal/envflag"
	"github.com/weftmesh/weft/internal/logging"
	"github.com/weftmesh/weft/ztunnel"
)

func main() {
	log, err := logging.New(os.Stderr, os.Getenv("LOG_FORMAT"), os.Getenv("LOG_LEVEL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "ztunnel:", err)
		os.Exit(2)
	}
	cfg, err := configFromEnv()
	if err == nil {
		err = cfg.Validate()
	}
	procs, perr := workerThreads(os.Getenv, runtime.GOMAXPROCS(0))
	if err == nil {
		err = perr
	}
	if err != nil {
		log.Error("invalid configuration", "error", err.Error())
		os.Exit(2)
	}
	if procs < runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(procs)
	}
	z, err := ztunnel.New(cfg, log)
	if err != nil {
		log.Error("starting ztunnel", "error", err.Error())
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("ztunnel starting", "node", cfg.NodeName, "xds", cfg.XDSAddress, "workerThreads", procs)
	if err := z.Run(ctx); err != nil {
		log.Error("ztunnel stopped", "error", err.Error())
		os.Exit(1)
	}
	log.Info("ztunnel stopped")
}

// workerThreads returns how many threads may run ztunnel's Go code at once
// (GOMAXPROCS): ZTUNNEL_WORKER_THREADS, Istio's ztunnel's variable, with its
// default of 2, so that a node proxy takes no more of a large node than
// Istio's does; never more than procs, the runtime's own choice (the
// node's CPUs, or fewer under a container CPU limit), and procs when
// GOMAXPROCS is set.
func workerThreads(getenv func(string) string, procs int) (int, error) {
	e := envflag.New(getenv)
	n := e.Int("ZTUNNEL_WORKER_THREADS", 2)
	if err := e.Err(); err != nil {
		return 0, err
	}
	if n < 1 {
		return 0, fmt.Errorf("ZTUNNEL_WORKER_THREADS=%d: at least one thread is needed", n)
	}
	if getenv("GOMAXPROCS") != "" {
		return procs, nil
	}
	return min(n, procs), nil
}

// configFromEnv reads Istio's ztunnel variable names where they exist.
func configFromEnv() (ztunnel.Config, error) {
	cfg := ztunnel.Config{
		NodeName:         os.Getenv("NODE_NAME"),
		PodName:          os.Getenv("POD_NAME"),
		PodNamespace:     os.Getenv("POD_NAMESPACE"),
		InstanceIP:       os.Getenv("INSTANCE_IP"),
		XDSAddress:       os.Getenv("XDS_ADDRESS"),
		CAAddress:        os.Getenv("CA_ADDRESS"),
		ControlPlaneName: os.Getenv("XDS_SAN"),
		RootCertFile:     os.Getenv("ROOT_CERT"),
		TokenFile:        os.Getenv("TOKEN_FILE"),
		ClusterID:        os.Getenv("CLUSTER_ID"),
		TrustDomain:      os.Getenv("TRUST_DOMAIN"),
		ZDSSocket:        os.Getenv("INPOD_UDS"),
		AdminAddr:        os.Getenv("ADMIN_ADDR"),
		MetricsAddr:      os.Getenv("METRICS_ADDR"),
		ReadyAddr:        os.Getenv("READINESS_ADDR"),
		ClusterDomain:    os.Getenv("CLUSTER_DOMAIN"),
	}
	e := envflag.New(os.Getenv)
	cfg.DNSProxyOff = !e.Bool("DNS_PROXY", true)
	cfg.CertTTL = e.Duration("SECRET_TTL", 0)
	cfg.DrainTimeout = e.Duration("CONNECTION_TERMINATION_DEADLINE", 0)
	cfg.HandoffTimeout = e.Duration("HANDOFF_TIMEOUT", 0)
	cfg.MaxConnectionsPerPod = e.Int("MAX_CONNECTIONS_PER_POD", 0)
	cfg.NoOriginalSource = !e.Bool("ENABLE_ORIG_SRC", true)
	if err := e.Err(); err != nil {
		return cfg, err
	}
	if cfg.XDSAddress == "" {
		// The control plane's Service, from the variables Kubernetes injects
		// into pods of the same namespace (there may be no cluster DNS).
		if host := os.Getenv("WEFT_CONTROLPLANE_SERVICE_HOST"); host != "" {
			cfg.XDSAddress = net.JoinHostPort(host, "15012")
		}
	}
	cfg.SetDefaults()
	return cfg, nil
}
