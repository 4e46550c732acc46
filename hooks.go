package dlock

// hooks are the seams of the package's own tests: an injected clock, a
// pacer other than dlock's, a wrapper around the store (to inject faults),
// and a flaw that breaks the Client on purpose, so that the simulation can
// show it catches it. No exported option sets them: outside the package's
// tests a Client's hooks are nil, and each check is one nil comparison.
type hooks struct {
	clock clock             // nil: the system clock
	pacer pacer             // nil: rulesPacer
	wrap  func(store) store // nil: the store as built
	flaw  flaw
}

// flawed reports whether h breaks the Client with flaw f.
func (h *hooks) flawed(f flaw) bool { return h != nil && h.flaw == f }

// A flaw breaks the Client on purpose (see hooks).
type flaw int

const (
	noFlaw                   flaw = iota
	flawWallClockExpiry           // a waiter takes over when its wall clock passes the holder's stamp plus the TTL
	flawDeadlineFromReply         // the lease deadline counted from the reply, not the send
	flawExtendReleasing           // the extender extends a lease being released (and Release ends it only once answered)
	flawNoWriterRegistration      // an RWMutex's waiting writer does not register, so readers can starve it
	flawSharedOverLimit           // a shared acquire allows one hold more than the limit
	flawReapLive                  // a waiter clears shared holds and registrations without waiting out their TTL
	flawUnfair                    // exclusive waiters do not queue in the document: every poll races (dlock before fair queueing)
	flawQueueJump                 // exclusive waiters register in the queue, but every attempt ignores it
	flawPassAsSeen                // a claim passes the waiters it last saw asleep, whether they still are or not: the server does not check that they are
	flawKeepAlways                // an Unlock under contention keeps its hold even when its Lock took a kept one (then with no spare token, so the next Lock takes it by a handoff write past the queue): a Client takes every turn in a row
	flawMultiCallerOrder          // a MultiMutex locks its keys in the caller's order, not sorted: two of them can wait for each other in a cycle
	flawSemaphoreOutOfOrder       // a Semaphore's registered waiter takes a permit whenever one is free, passing the waiters ahead of it
	flawViewOfOtherKey            // the watcher hands each wait of a round the view of another key of that round
	flawActOnStaleRead            // a Semaphore's registered waiter acts on a read from before its registration was numbered
)
