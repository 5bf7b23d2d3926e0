package deployer

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwfake "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/fake"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"
)

// TestRunLifecycle: New starts nothing; Run works with fake clients and,
// once its context ends, returns only after its workers and informers have
// stopped, whether or not its caches had synced.
func TestRunLifecycle(t *testing.T) {
	for _, synced := range []bool{true, false} {
		name := map[bool]string{true: "running", false: "never-synced"}[synced]
		t.Run(name, func(t *testing.T) {
			ignore := goleak.IgnoreCurrent()
			gw, _ := readCase(t, "testdata/plain.in.yaml")
			class := &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "istio-waypoint"},
				Spec: gwv1.GatewayClassSpec{ControllerName: "weft.dev/waypoint-controller"}}
			kube := kubefake.NewClientset()
			// The gateway-api fake's field-managed tracker knows no
			// Gateway types, and a seeded Gateway is filed under a
			// wrong plural: create them through the simple one.
			gwc := gwfake.NewSimpleClientset()
			if _, err := gwc.GatewayV1().Gateways(gw.Namespace).Create(context.Background(), gw, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := gwc.GatewayV1().GatewayClasses().Create(context.Background(), class, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			inf := gwinformers.NewSharedInformerFactory(gwc, 0)
			d, err := New(testConfig, kube, gwc, inf.Gateway().V1().Gateways().Informer(), inf.Gateway().V1().GatewayClasses().Informer(), testLogger(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := goleak.Find(ignore); err != nil {
				t.Errorf("New started goroutines: %v", err)
			}
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			if synced { // else the Gateway informers never start
				inf.Start(ctx.Done())
			}
			done := make(chan error, 1)
			go func() { done <- d.Run(ctx) }()
			if synced {
				wait := ctxFor(t, 2*time.Minute)
				eventually(t, wait, "the waypoint Deployment applied and the class accepted", func(ctx context.Context) (bool, string) {
					if _, err := kube.AppsV1().Deployments(gw.Namespace).Get(ctx, gw.Name, metav1.GetOptions{}); err != nil {
						return false, errState(err)
					}
					gc, err := gwc.GatewayV1().GatewayClasses().Get(ctx, class.Name, metav1.GetOptions{})
					if err != nil {
						return false, errState(err)
					}
					return meta.IsStatusConditionTrue(gc.Status.Conditions, "Accepted"), condition(gc.Status.Conditions, "Accepted")
				})
				eventually(t, wait, "the Gateway Accepted", func(ctx context.Context) (bool, string) {
					g, err := gwc.GatewayV1().Gateways(gw.Namespace).Get(ctx, gw.Name, metav1.GetOptions{})
					if err != nil {
						return false, errState(err)
					}
					return meta.IsStatusConditionTrue(g.Status.Conditions, "Accepted"), condition(g.Status.Conditions, "Accepted")
				})
			}
			stop()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			inf.Shutdown() // the caller's informers
			goleak.VerifyNone(t, ignore)
		})
	}
}
