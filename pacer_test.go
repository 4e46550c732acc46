package dlock

import (
	"math/rand/v2"
	"time"
)

// backoffPacer paces every wait on plain backoff: no turn plans, no kept
// holds, none of the rules' sleeps.
type backoffPacer struct{}

func (backoffPacer) sleep(_, backoff time.Duration) time.Duration { return backoff }

func (backoffPacer) uses(rule) bool { return false }

// randomPacer answers at random: any sleep up to max, which may be beyond
// the cap that waitPoll puts on every sleep (maxSleep), with or without
// the rules' plans. Without the cap, the crashed-holder bound of
// TestRequeuedWaitCrashAhead fails with it.
type randomPacer struct {
	max  time.Duration
	plan bool
}

func (p randomPacer) sleep(_, _ time.Duration) time.Duration {
	return time.Duration(rand.Int64N(int64(p.max) + 1))
}

func (p randomPacer) uses(rule) bool { return p.plan }

// withoutRule is dlock's pacer with one rule switched off.
type withoutRule struct{ off rule }

func (withoutRule) sleep(proposed, _ time.Duration) time.Duration { return proposed }

func (p withoutRule) uses(r rule) bool { return r != p.off }

// pacers are the pacers every liveness bound must hold for.
func pacers() []struct {
	name  string
	pacer pacer
} {
	most := 2 * maxSleep(&config{maxBackoff: DefaultMaxBackoff}) // half its answers beyond the cap
	return []struct {
		name  string
		pacer pacer
	}{
		{"rules", rulesPacer{}},
		{"random", randomPacer{max: most}},
		{"random with plans", randomPacer{max: most, plan: true}},
		{"backoff", backoffPacer{}},
	}
}
