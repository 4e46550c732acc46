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
	// uses reports whether the waits and Unlocks it paces follow rule r.
	uses(r rule) bool
}

// A rule is one of the pacing rules that a pacer may follow, each for
// fewer commands or shorter waits; docs/fairness.md has what each buys.
type rule uint8

const (
	ruleKeep     rule = 1 << iota // an Unlock of a short hold keeps it for its Mutex's next Lock (keep.go)
	ruleRequeue                   // an Unlock under contention registers its Mutex's next Lock in the same write (requeue.go)
	ruleTurnPlan                  // a requeued wait sleeps until its turn is due (turn.go: planTurn)
	ruleHeadPlan                  // a head that saw the hold it waits for begin sleeps until it is due to end (turn.go: planHead)
	rulePeriod                    // waits poll at fractions of how often the key changes hands (wait.go: pause)
)

// rulesPacer is dlock's pacer: every rule, each sleep as the rules propose.
type rulesPacer struct{}

func (rulesPacer) sleep(proposed, _ time.Duration) time.Duration { return proposed }

func (rulesPacer) uses(rule) bool { return true }
