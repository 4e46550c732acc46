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

func (backoffPacer) aim(tp turnPlan) turnPlan { return tp }

func (backoffPacer) doze(int, int, bool) (bool, bool) { return false, false }

// randomPacer answers at random: any sleep up to max, which may be beyond
// the cap that waitPoll puts on every sleep (maxSleep), with or without
// the rules' plans. Without the cap, the crashed-holder bound of
// TestRequeuedWaitCrashAhead fails with it.
type randomPacer struct {
	max   time.Duration
	plan  bool
	marks bool // marks registrations asleep and awake at random, whatever their place
}

func (p randomPacer) sleep(_, _ time.Duration) time.Duration {
	return time.Duration(rand.Int64N(int64(p.max) + 1))
}

func (p randomPacer) uses(rule) bool { return p.plan }

// doze, with marks, marks a registration asleep or awake at random,
// whatever its place; otherwise as dlock's pacer does. (The liveness
// scenes set their queues up in order, which a sleeper lets others pass.)
func (p randomPacer) doze(ahead, awake int, asleep bool) (bool, bool) {
	if !p.marks {
		return byPlace(ahead, awake, asleep)
	}
	return rand.IntN(2) == 0, rand.IntN(2) == 0
}

// aim, with plans, aims half of them at once and half up to a day late,
// with retries up to an hour apart (see stalePlans).
func (p randomPacer) aim(tp turnPlan) turnPlan {
	if !p.plan {
		return tp
	}
	late := time.Duration(0)
	if rand.IntN(2) == 0 {
		late = time.Duration(rand.Int64N(int64(24 * time.Hour)))
	}
	return stalePlans{late: late, retry: time.Duration(rand.Int64N(int64(time.Hour))) + 1}.aim(tp)
}

// stalePlans is dlock's pacer, but for its plans: each aims late after
// the wait joined (0: its attempts are due at once) and retries every
// retry, as a plan built on a stale sighting would (a hand-over period
// estimated from a counter seen moving a day ago, a turn learnt from
// holds far longer than today's).
type stalePlans struct{ late, retry time.Duration }

func (stalePlans) sleep(proposed, _ time.Duration) time.Duration { return proposed }

func (stalePlans) uses(rule) bool { return true }

func (stalePlans) doze(ahead, awake int, asleep bool) (bool, bool) {
	return byPlace(ahead, awake, asleep)
}

func (p stalePlans) aim(tp turnPlan) turnPlan {
	if tp.on {
		tp.next, tp.retry = tp.joined.Add(p.late), p.retry
	}
	return tp
}

// wakeCountsSleepers is dlock's pacer, but for a flaw: a sleeper wakes by
// how many waiters are ahead of it, asleep or not, so one behind waiters
// that died asleep sleeps on while the key stands free.
type wakeCountsSleepers struct{ rulesPacer }

func (wakeCountsSleepers) doze(ahead, _ int, asleep bool) (bool, bool) {
	return byPlace(ahead, ahead, asleep)
}

// withoutRule is dlock's pacer with one rule switched off.
type withoutRule struct{ off rule }

func (withoutRule) sleep(proposed, _ time.Duration) time.Duration { return proposed }

func (p withoutRule) uses(r rule) bool { return r != p.off }

func (withoutRule) aim(tp turnPlan) turnPlan { return tp }

func (p withoutRule) doze(ahead, awake int, asleep bool) (bool, bool) {
	if p.off == ruleSleep {
		return false, false
	}
	return byPlace(ahead, awake, asleep)
}

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
		{"plans due at once, retried hourly", stalePlans{0, time.Hour}},
		{"plans due at once, retried often", stalePlans{0, DefaultMaxBackoff / 2}},
		{"plans a day late", stalePlans{24 * time.Hour, time.Hour}},
	}
}

// A namedRule is a pacing rule as the benchmarks name it, to switch it off.
type namedRule struct {
	name string
	r    rule
}

// namedRules are the rules the benchmarks price by switching each off.
var namedRules = []namedRule{{"keep", ruleKeep}, {"requeue", ruleRequeue}, {"turn-plan", ruleTurnPlan}, {"head-plan", ruleHeadPlan}, {"period", rulePeriod}, {"sleep", ruleSleep}, {"age", ruleAge}, {"watch", ruleWatch}}
