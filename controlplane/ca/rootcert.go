package ca

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/weftmesh/weft/internal/kubequeue"
)

// The ConfigMap that carries the mesh root to every namespace, Istio's.
const (
	RootCertConfigMap = "istio-ca-root-cert"
	RootCertKey       = "root-cert.pem"
)

// RootCertPublisher keeps ConfigMap istio-ca-root-cert, key root-cert.pem,
// in every namespace equal to the mesh roots: it creates it in new
// namespaces and puts it back when it is edited or deleted.
type RootCertPublisher struct {
	roots      string
	namespaces cache.SharedIndexInformer
	configMaps cache.SharedIndexInformer // filtered to RootCertConfigMap
	client     corev1client.ConfigMapsGetter
	log        *slog.Logger
	queue      *kubequeue.Queue[string] // of namespace names
	writes     *prometheus.CounterVec
}

// NewRootCertPublisher returns a publisher of rootsPEM. configMaps must be
// an informer on ConfigMaps named RootCertConfigMap (a field selector keeps
// its cache small). It starts nothing; call Run.
func NewRootCertPublisher(rootsPEM []byte, namespaces, configMaps cache.SharedIndexInformer, client corev1client.ConfigMapsGetter,
	log *slog.Logger, reg prometheus.Registerer) (*RootCertPublisher, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &RootCertPublisher{
		roots: string(rootsPEM), namespaces: namespaces, configMaps: configMaps, client: client, log: log,
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_root_cert_configmap_writes_total",
			Help: "Writes of the istio-ca-root-cert ConfigMap, by operation (create, update) and result.",
		}, []string{"op", "result"}),
	}
	if reg != nil {
		if err := reg.Register(p.writes); err != nil {
			return nil, fmt.Errorf("creating root certificate publisher: registering metrics: %w", err)
		}
	}
	p.queue = kubequeue.New(kubequeue.Config{Name: "root-cert", KeyAttr: "namespace", Logger: log}, p.sync)
	return p, nil
}

// Run reconciles until ctx is done. The caller starts the informers.
func (p *RootCertPublisher) Run(ctx context.Context) error {
	defer p.queue.ShutDown()
	nsReg, err := p.namespaces.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.enqueue(obj, true) },
		UpdateFunc: func(_, obj any) { p.enqueue(obj, true) },
	})
	if err != nil {
		return fmt.Errorf("watching namespaces: %w", err)
	}
	defer func() { _ = p.namespaces.RemoveEventHandler(nsReg) }()
	cmReg, err := p.configMaps.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) { p.enqueue(obj, false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			p.enqueue(obj, false)
		},
	})
	if err != nil {
		return fmt.Errorf("watching ConfigMaps: %w", err)
	}
	defer func() { _ = p.configMaps.RemoveEventHandler(cmReg) }()
	if !cache.WaitForCacheSync(ctx.Done(), nsReg.HasSynced, cmReg.HasSynced) {
		return nil
	}
	p.queue.Run(ctx, 1)
	return nil
}

func (p *RootCertPublisher) enqueue(obj any, isNamespace bool) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	if isNamespace {
		p.queue.Add(m.GetName())
	} else {
		p.queue.Add(m.GetNamespace())
	}
}

// sync brings one namespace's ConfigMap in line; the queue retries an error.
func (p *RootCertPublisher) sync(ctx context.Context, ns string) error {
	obj, ok, err := p.namespaces.GetIndexer().GetByKey(ns)
	if err != nil {
		return err
	}
	if !ok {
		return nil
	}
	if n := obj.(*corev1.Namespace); n.Status.Phase == corev1.NamespaceTerminating || n.DeletionTimestamp != nil {
		return nil
	}
	want := map[string]string{RootCertKey: p.roots}
	cur, ok, err := p.configMaps.GetIndexer().GetByKey(ns + "/" + RootCertConfigMap)
	if err != nil {
		return err
	}
	if !ok {
		_, err := p.client.ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: RootCertConfigMap, Namespace: ns,
				Labels: map[string]string{"istio.io/config": "true", "app.kubernetes.io/part-of": "weft"}},
			Data: want,
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil // the informer will show it; an update follows if it differs
		}
		p.count("create", err)
		if err != nil {
			return fmt.Errorf("creating ConfigMap %s/%s: %w", ns, RootCertConfigMap, err)
		}
		return nil
	}
	cm := cur.(*corev1.ConfigMap)
	if cm.Data[RootCertKey] == p.roots {
		return nil
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[RootCertKey] = p.roots
	_, err = p.client.ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
	p.count("update", err)
	if err != nil {
		return fmt.Errorf("updating ConfigMap %s/%s: %w", ns, RootCertConfigMap, err)
	}
	p.log.Info("root certificate ConfigMap restored", "namespace", ns)
	return nil
}

func (p *RootCertPublisher) count(op string, err error) {
	res := "ok"
	if err != nil {
		res = "error"
	}
	p.writes.WithLabelValues(op, res).Inc()
}
