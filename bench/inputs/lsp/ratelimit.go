// Package ratelimit limits how often each client may call an HTTP service, with one token
// bucket per client key (usually the remote address).
package ratelimit

import (
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Bucket holds up to Capacity tokens and gains Rate tokens per second.
type Bucket struct {
	Capacity float64
	Rate     float64
	tokens   float64
	updated  time.Time
}

// Take removes one token if there is one, and says how long to wait otherwise.
func (b *Bucket) Take(now time.Time) (bool, time.Duration) {
	if b.updated.IsZero() {
		b.tokens = b.Capacity
	} else {
		elapsed := now.Sub(b.updated).Seconds()
		b.tokens = min(b.Capacity, b.tokens+elapsed*b.Rate)
	}
	b.updated = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	missing := 1 - b.tokens
	return false, time.Duration(missing / b.Rate * float64(time.Second))
}

// Limiter keeps one bucket per key and forgets keys that have been idle for a while.
type Limiter struct {
	Capacity float64
	Rate     float64
	IdleTTL  time.Duration
	Now      func() time.Time

	mu      sync.Mutex
	buckets map[string]*Bucket
}

// New returns a limiter that allows bursts of capacity and rate requests per second after that.
func New(capacity, rate float64) *Limiter {
	return &Limiter{
		Capacity: capacity,
		Rate:     rate,
		IdleTTL:  10 * time.Minute,
		Now:      time.Now,
		buckets:  make(map[string]*Bucket),
	}
}

// Allow reports whether the client with this key may make a request now.
func (l *Limiter) Allow(key string) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[key]
	if !ok {
		b = &Bucket{Capacity: l.Capacity, Rate: l.Rate}
		l.buckets[key] = b
	}
	return b.Take(l.Now())
}

// Sweep drops the buckets of clients that have not been seen for IdleTTL.
func (l *Limiter) Sweep() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.Now()
	dropped := 0
	for key, b := range l.buckets {
		if now.Sub(b.updated) > l.IdleTTL {
			delete(l.buckets, key)
			dropped++
		}
	}
	return dropped
}

// ClientKey is the remote host of the request, without its port.
func ClientKey(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// Middleware answers 429 Too Many Requests, with a Retry-After header, to clients over the limit.
func (l *Limiter) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok, wait := l.Allow(ClientKey(r))
		if !ok {
			seconds := int(wait.Seconds()) + 1
			w.Header().Set("Retry-After", strconv.Itoa(seconds))
			http.Error(w, "too many requests", http.StatusTooManyRequests)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// SweepEvery runs Sweep on a timer until stop is closed.
func (l *Limiter) SweepEvery(interval time.Duration, stop <-chan struct{}) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
			l.Sweep()
		case <-stop:
			return
		}
	}
}
