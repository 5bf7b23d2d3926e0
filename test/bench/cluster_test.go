package bench

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/weftmesh/weft/test/cluster"
)

// toolsBuild reads the build records scripts/tools.sh leaves in
// bin/.tools/<group>.build and sums their durations.
func toolsBuild(binDir string) (seconds int, source string, err error) {
	var parts []string
	for _, g := range []string{"kube", "kubelet", "etcd", "helm", "cni"} {
		path := filepath.Join(binDir, ".tools", g+".build")
		f, err := os.Open(path)
		if err != nil {
			return 0, "", fmt.Errorf("no build record for tool group %s (run `make tools`): %w", g, err)
		}
		rec := map[string]string{}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), "="); ok {
				rec[k] = v
			}
		}
		f.Close()
		s, err := strconv.Atoi(rec["seconds"])
		if err != nil {
			return 0, "", fmt.Errorf("%s: bad seconds %q", path, rec["seconds"])
		}
		seconds += s
		parts = append(parts, fmt.Sprintf("%s %ss (GOCACHE %s, %s)", g, rec["seconds"], rec["cache"], rec["date"]))
	}
	return seconds, "recorded by scripts/tools.sh in bin/.tools/*.build: " + strings.Join(parts, ", "), nil
}

// BenchmarkCluster reports, once:
//
//	cluster_cold_tools_build_s  the tools' build time as scripts/tools.sh recorded it
//	                            (a cold figure when recorded with TOOLS_COLD=1 or on a fresh machine)
//	cluster_start_s             Start of a 2-node cluster, tools and images built, to all nodes Ready
//	cluster_pod_ready_p99_ms    20 pods created back to back, each from its Create call to Ready
func BenchmarkCluster(b *testing.B) {
	if why := cluster.SkipReason(); why != "" {
		b.Skip(why)
	}
	cfg := cluster.Config{Nodes: 2, Images: []string{}}
	if err := cfg.SetDefaults(); err != nil {
		b.Fatal(err)
	}
	if secs, source, err := toolsBuild(cfg.BinDir); err != nil {
		b.Logf("cluster_cold_tools_build_s: %v", err)
	} else {
		fmt.Printf("bench: cluster_cold_tools_build_s %d\n", secs)
		b.Logf("cluster_cold_tools_build_s %s", source)
	}

	// Images first, so Start measures the cluster alone.
	build := exec.Command(cfg.Go, "build", "-buildvcs=false", "-o", cfg.BinDir+"/", "./test/cmd/echo")
	build.Dir = cfg.RepoDir
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building weft/echo: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cfg, cluster.TestLogger())
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			b.Error(err)
		}
		if left := c.Leftovers(); len(left) > 0 {
			b.Errorf("teardown left: %v", left)
		}
	}()
	fmt.Printf("bench: cluster_start_s %.1f\n", c.StartDuration().Seconds())
	b.ReportMetric(c.StartDuration().Seconds(), "start_s")

	const ns, n = "bench", 20
	if err := c.Apply(ctx, cluster.NamespaceManifest(ns, nil)); err != nil {
		b.Fatal(err)
	}
	if err := c.WaitFor(ctx, "the default service account of "+ns, func(ctx context.Context) (bool, error) {
		_, err := c.Client().CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		b.Fatal(err)
	}
	pods := c.Client().CoreV1().Pods(ns)
	w, err := pods.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	created := map[string]time.Time{}
	zero := int64(0)
	b.ResetTimer()
	for i := range n {
		name := fmt.Sprintf("pod-%02d", i)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "bench"}},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: &zero,
				Containers: []corev1.Container{{
					Name: "echo", Image: "weft/echo:latest", ImagePullPolicy: corev1.PullIfNotPresent,
					Args: []string{"-http", "8080", "-grpc", "", "-tcp", ""},
				}},
			},
		}
		created[name] = time.Now()
		if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	var took []time.Duration
	seen := map[string]bool{}
	for len(took) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatal("pod watch closed")
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod || ev.Type == watch.Deleted || seen[p.Name] || !ready(p) {
				continue
			}
			seen[p.Name] = true
			took = append(took, time.Since(created[p.Name]))
		case <-ctx.Done():
			c.Dump(b.Logf)
			b.Fatalf("%d of %d pods Ready before the deadline", len(took), n)
		}
	}
	b.StopTimer()
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	p := func(q float64) time.Duration { return took[int(math.Ceil(q*float64(n)))-1] }
	fmt.Printf("bench: cluster_pod_ready_p99_ms %d\n", p(0.99).Milliseconds())
	b.Logf("pod created to Ready over %d pods: p50 %s, p90 %s, p99 %s", n, p(0.5), p(0.9), p(0.99))
	b.ReportMetric(float64(p(0.99).Milliseconds()), "pod_ready_p99_ms")
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
