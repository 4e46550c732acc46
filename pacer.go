package dlock

import "time"

// A pacer decides when a wait sends its next command. Whatever it
// answers, the server's filters keep exclusion, the queue's order and the
// tokens (docs/design.md): its mistakes cost commands and latency, never
// safety. Nor liveness: waitPoll caps every sleep at maxSleep and wakes a
// wait when a watch says that a holder, or a waiter ahead, may be
// cleared, so the bounds of docs/fairness.md hold whatever it answers.
// The simulation checks both with two more pacers than dlock's own: one
// that answers at random within the caps, and plain backoff.
type pacer interface {
	// sleep returns how long a wait sleeps before its next round, given
	// what the wait's rules propose and what plain backoff would.
	sleep(proposed, backoff time.Duration) time.Duration
	// plans reports whether waits plan their turns (turn.go) and Unlocks
	// keep their holds (keep.go).
	plans() bool
}

// rulesPacer is dlock's pacer: the rules of turn.go, keep.go and
// requeue.go.
type rulesPacer struct{}

func (rulesPacer) sleep(proposed, _ time.Duration) time.Duration { return proposed }

func (rulesPacer) plans() bool { return true }
