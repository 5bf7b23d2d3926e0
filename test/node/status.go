package node

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// status computes the pod's status from the worker's state, keeping the
// transition times of conditions that did not change.
func (w *podWorker) status() corev1.PodStatus {
	now := time.Now()
	st := corev1.PodStatus{
		HostIP:             w.r.cfg.Address.String(),
		HostIPs:            []corev1.HostIP{{IP: w.r.cfg.Address.String()}},
		StartTime:          &w.startTime,
		QOSClass:           w.pod.Status.QOSClass,
		ObservedGeneration: w.pod.Generation,
	}
	if w.sandboxReady && w.ip.IsValid() {
		st.PodIP = w.ip.String()
		st.PodIPs = []corev1.PodIP{{IP: st.PodIP}}
	}
	initsDone := true
	for _, c := range w.inits {
		st.InitContainerStatuses = append(st.InitContainerStatuses, w.containerStatus(c, now, false))
		if !c.done {
			initsDone = false
		}
	}
	allReady := len(w.containers) > 0
	running, succeeded, failed, waiting := 0, 0, 0, 0
	policy := w.pod.Spec.RestartPolicy
	for _, c := range w.containers {
		cs := w.containerStatus(c, now, !initsDone)
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
		if !cs.Ready {
			allReady = false
		}
		switch {
		case c.running:
			running++
		case c.term != nil && !shouldRestart(policy, c.term.ExitCode):
			if c.term.ExitCode == 0 {
				succeeded++
			} else {
				failed++
			}
		case c.term != nil:
			running++ // restarting
		default:
			waiting++
		}
	}
	for _, c := range w.inits {
		if c.sidecar && c.running && !c.ready {
			allReady = false
		}
	}
	initFailed := false
	for _, c := range w.inits {
		if !c.sidecar && c.term != nil && c.term.ExitCode != 0 && policy == corev1.RestartPolicyNever {
			initFailed = true
		}
	}
	switch {
	case initFailed:
		st.Phase = corev1.PodFailed
	case !initsDone || waiting > 0 && running == 0 && succeeded+failed == 0:
		st.Phase = corev1.PodPending
	case running > 0:
		st.Phase = corev1.PodRunning
	case waiting > 0:
		st.Phase = corev1.PodPending
	case failed > 0:
		st.Phase = corev1.PodFailed
	default:
		st.Phase = corev1.PodSucceeded
	}
	if st.Phase != corev1.PodRunning {
		allReady = false
	}
	gatesOK := true
	for _, g := range w.pod.Spec.ReadinessGates {
		ok := false
		for _, c := range w.pod.Status.Conditions {
			if c.Type == g.ConditionType && c.Status == corev1.ConditionTrue {
				ok = true
			}
		}
		gatesOK = gatesOK && ok
	}
	cond := func(t corev1.PodConditionType, ok bool, reason string) corev1.PodCondition {
		s := corev1.ConditionFalse
		if ok {
			s, reason = corev1.ConditionTrue, ""
		}
		c := corev1.PodCondition{Type: t, Status: s, Reason: reason, LastTransitionTime: metav1.NewTime(now), ObservedGeneration: w.pod.Generation}
		if w.reported != nil {
			for _, p := range w.reported.Conditions {
				if p.Type == t && p.Status == s {
					c.LastTransitionTime = p.LastTransitionTime
				}
			}
		}
		return c
	}
	st.Conditions = []corev1.PodCondition{
		cond(corev1.PodReadyToStartContainers, w.sandboxReady, ""),
		cond(corev1.PodInitialized, initsDone, "ContainersNotInitialized"),
		cond(corev1.ContainersReady, allReady, "ContainersNotReady"),
		cond(corev1.PodReady, allReady && gatesOK, "ContainersNotReady"),
	}
	for _, c := range w.pod.Status.Conditions {
		switch c.Type {
		case corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady:
		default:
			st.Conditions = append(st.Conditions, c) // PodScheduled, readiness gates, ...
		}
	}
	return st
}

func (w *podWorker) containerStatus(c *container, now time.Time, initPending bool) corev1.ContainerStatus {
	started := c.running && c.started
	cs := corev1.ContainerStatus{
		Name:         c.spec.Name,
		Image:        c.spec.Image,
		ImageID:      "weft-node://" + c.spec.Image,
		Ready:        c.running && c.ready && c.started,
		Started:      &started,
		RestartCount: int32(c.restarts),
	}
	if c.gen > 0 {
		cs.ContainerID = containerID(w.uid, c)
	}
	if c.lastTerm != nil || (c.running && c.term != nil) {
		t := c.term
		if !c.running {
			t = c.lastTerm
		}
		if t != nil {
			cs.LastTerminationState = corev1.ContainerState{Terminated: t}
		}
	}
	policy := w.pod.Spec.RestartPolicy
	switch {
	case c.running:
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(c.startedAt)}
	case c.term != nil && (c.init && !c.sidecar && c.term.ExitCode == 0 || !shouldRestart(policy, c.term.ExitCode) && !c.sidecar):
		cs.State.Terminated = c.term
	case c.term != nil:
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
			Message: "back-off restarting failed container " + c.spec.Name}
		if now.After(c.nextStart) {
			cs.State.Waiting.Reason = "ContainerCreating"
		}
		cs.LastTerminationState = corev1.ContainerState{Terminated: c.term}
	case c.waitWhy != "":
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: c.waitWhy, Message: c.waitMsg}
	case initPending:
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "PodInitializing"}
	default:
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
	}
	return cs
}
