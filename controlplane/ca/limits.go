package ca

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
)

// Default limits. A node proxy asks for one certificate per identity on its
// node (at most a few hundred; kubelet's default is 110 pods), all at once
// when it starts, then one per identity every half certificate lifetime.
const (
	DefaultMaxInFlight          = 512
	DefaultRate                 = 500
	DefaultBurst                = 1000
	DefaultPerCallerMaxInFlight = 128
	DefaultPerCallerRate        = 50
	DefaultPerCallerBurst       = 250
)

// Limits bound the CreateCertificate requests the CA serves. Beyond a limit
// a request is refused at once with ResourceExhausted; callers retry with
// backoff. The global limits apply before the caller is authenticated (they
// also bound the TokenReviews a flood of requests causes), the per-caller
// ones after, per caller pod (all node proxies share one service account,
// so a service account would be the wrong unit). Zero fields take the
// defaults; a negative field disables its limit.
type Limits struct {
	// MaxInFlight caps requests in progress at once. Default 512.
	MaxInFlight int
	// Rate and Burst are the token bucket of all requests: Rate per second,
	// up to Burst at once. Defaults 500 and 1000.
	Rate  float64
	Burst int
	// PerCallerMaxInFlight caps one caller pod's requests in progress.
	// Default 128.
	PerCallerMaxInFlight int
	// PerCallerRate and PerCallerBurst are each caller pod's token bucket.
	// Defaults 50 and 250.
	PerCallerRate  float64
	PerCallerBurst int
}

// withDefaults applies the defaults and checks the limits.
func (l Limits) withDefaults() (Limits, error) {
	defInt := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	defFloat := func(p *float64, v float64) {
		if *p == 0 {
			*p = v
		}
	}
	defInt(&l.MaxInFlight, DefaultMaxInFlight)
	defFloat(&l.Rate, DefaultRate)
	defInt(&l.Burst, DefaultBurst)
	defInt(&l.PerCallerMaxInFlight, DefaultPerCallerMaxInFlight)
	defFloat(&l.PerCallerRate, DefaultPerCallerRate)
	defInt(&l.PerCallerBurst, DefaultPerCallerBurst)
	if l.Rate > 0 && l.Burst < 1 {
		return l, fmt.Errorf("limits: a rate of %v/s needs a burst of at least 1", l.Rate)
	}
	if l.PerCallerRate > 0 && l.PerCallerBurst < 1 {
		return l, fmt.Errorf("limits: a per-caller rate of %v/s needs a burst of at least 1", l.PerCallerRate)
	}
	return l, nil
}

// maxCallerEntries is the number of per-caller buckets kept before idle ones
// are dropped.
const maxCallerEntries = 4096

// admission enforces Limits.
type admission struct {
	lim      Limits
	now      func() time.Time
	global   *rate.Limiter // nil: no rate limit
	inFlight atomic.Int64

	mu      sync.Mutex
	callers map[string]*callerBucket // guarded by mu
}

type callerBucket struct {
	lim      *rate.Limiter // nil: no rate limit
	inFlight int
	last     time.Time
}

func newAdmission(l Limits, now func() time.Time) *admission {
	a := &admission{lim: l, now: now, callers: map[string]*callerBucket{}}
	if l.Rate > 0 {
		a.global = rate.NewLimiter(rate.Limit(l.Rate), l.Burst)
	}
	return a
}

func exhausted(reason, public string) *Refusal {
	return refuse(codes.ResourceExhausted, reason, public, "")
}

// enter admits a request under the global limits; call the release it
// returns when the request is done.
func (a *admission) enter() (release func(), r *Refusal) {
	if a.lim.MaxInFlight > 0 {
		if n := a.inFlight.Add(1); n > int64(a.lim.MaxInFlight) {
			a.inFlight.Add(-1)
			return nil, exhausted("ca_busy", "the CA has too many requests in progress; retry with backoff")
		}
	}
	if a.global != nil && !a.global.AllowN(a.now(), 1) {
		a.leave()
		return nil, exhausted("ca_rate_limited", "the CA is over its request rate; retry with backoff")
	}
	return a.leave, nil
}

func (a *admission) leave() {
	if a.lim.MaxInFlight > 0 {
		a.inFlight.Add(-1)
	}
}

// enterCaller admits a request of an authenticated caller (key names its
// pod) under the per-caller limits.
func (a *admission) enterCaller(key string) (release func(), r *Refusal) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.callers[key]
	if b == nil {
		if len(a.callers) >= maxCallerEntries {
			a.pruneLocked(now)
		}
		b = &callerBucket{}
		if a.lim.PerCallerRate > 0 {
			b.lim = rate.NewLimiter(rate.Limit(a.lim.PerCallerRate), a.lim.PerCallerBurst)
		}
		a.callers[key] = b
	}
	b.last = now
	if a.lim.PerCallerMaxInFlight > 0 && b.inFlight >= a.lim.PerCallerMaxInFlight {
		return nil, exhausted("caller_busy", "this caller has too many requests in progress; retry with backoff")
	}
	if b.lim != nil && !b.lim.AllowN(now, 1) {
		return nil, exhausted("caller_rate_limited", "this caller is over its request rate; retry with backoff")
	}
	b.inFlight++
	return func() {
		a.mu.Lock()
		b.inFlight--
		b.last = a.now()
		a.mu.Unlock()
	}, nil
}

// pruneLocked drops the buckets of callers with nothing in progress whose
// bucket has refilled: a new bucket for them is the same.
func (a *admission) pruneLocked(now time.Time) {
	refill := time.Duration(0)
	if a.lim.PerCallerRate > 0 {
		refill = time.Duration(float64(a.lim.PerCallerBurst) / a.lim.PerCallerRate * float64(time.Second))
	}
	for k, b := range a.callers {
		if b.inFlight == 0 && now.Sub(b.last) >= refill {
			delete(a.callers, k)
		}
	}
}
