package dlock

import (
	"sync"
	"time"
)

// This file is the pacing of waits: when a wait sends its next command,
// and whether that is an acquire attempt or a read. Its contract: whatever
// it answers, the server's filters keep exclusion, the queue's order and
// the tokens (docs/design.md), so its mistakes cost commands and latency,
// never safety; and waitPoll caps every sleep (schedule.limit) and wakes a
// wait when a watch says that a holder, or a waiter ahead, may be
// cleared, and every round that did not read reads when a watch is due
// (Client.acquire), so the liveness bounds of docs/fairness.md hold
// whatever it answers too.
//
// Three types share the work. A schedule paces one wait, from what the
// wait tells it it saw. A pacing is what a primitive remembers of its
// waits and holds from one wait to the next. A pacer says which rules
// they follow, and may change the sleeps they propose: dlock's follows
// every rule (rulesPacer); the tests run, besides, one that answers at
// random and plain backoff, and every property holds with each.

// A pacer chooses the rules that schedules and Unlocks follow, and the
// sleeps (see the file's comment).
type pacer interface {
	// sleep returns how long a wait sleeps before its next round, given
	// what the wait's rules propose and what plain backoff would.
	sleep(proposed, backoff time.Duration) time.Duration
	// uses reports whether the waits and Unlocks it paces follow rule r.
	uses(r rule) bool
	// aim returns the plan a wait follows, given the one its rules made
	// (planTurn, planHead): the liveness bounds hold whatever it answers,
	// a plan aimed hours late included (Client.acquire's watches' check).
	aim(tp turnPlan) turnPlan
	// doze says whether a registered waiter with ahead waiters ahead of
	// it, awake of them awake, its registration marked asleep or not,
	// changes its mark (change) to sleep: exclusion and the queue's order
	// hold whatever it answers, as the server checks every mark a claim
	// passes (the simulation runs a pacer that marks at random).
	doze(ahead, awake int, asleep bool) (sleep, change bool)
}

// A rule is one of the pacing rules that a pacer may follow, each for
// fewer commands or shorter waits; docs/fairness.md has what each buys.
type rule uint8

const (
	ruleKeep     rule = 1 << iota // an Unlock of a short hold keeps it for its Mutex's next Lock (keep.go)
	ruleRequeue                   // an Unlock under contention registers its Mutex's next Lock in the same write (requeue.go)
	ruleTurnPlan                  // a requeued wait sleeps until its turn is due (planTurn)
	ruleHeadPlan                  // a head that saw the hold it waits for begin sleeps until it is due to end (planHead)
	rulePeriod                    // registered waits poll at fractions of how often the key changes hands (schedule.next)
	ruleSleep                     // a waiter far back marks its registration asleep and sleeps by its place (byPlace)
	ruleAge                       // an awake wait reads as often as the hold it waits behind is young (schedule.age)
	ruleWatch                     // a wait that sleeps long shares its reads with the Client's other waits (watcher.go)
)

// rulesPacer is dlock's pacer: every rule, each sleep as the rules propose.
type rulesPacer struct{}

func (rulesPacer) sleep(proposed, _ time.Duration) time.Duration { return proposed }

func (rulesPacer) uses(rule) bool { return true }

func (rulesPacer) aim(tp turnPlan) turnPlan { return tp }

func (rulesPacer) doze(ahead, awake int, asleep bool) (sleep, change bool) {
	return byPlace(ahead, awake, asleep)
}

// byPlace is ruleSleep: a waiter marks its registration asleep once it
// sees sleepPlaces or more waiters ahead, awakePlaces or more of them
// awake, and awake on its first read that shows fewer than awakePlaces
// awake ahead: by the awake alone, as one that died asleep never wakes,
// and counting it would keep a live waiter asleep while the key stands
// free. The two never hold at once: a waiter whose view of those ahead
// only shrinks changes its mark at most once each way.
func byPlace(ahead, awake int, asleep bool) (sleep, change bool) {
	if asleep {
		return false, awake < awakePlaces
	}
	return true, ahead >= sleepPlaces && awake >= awakePlaces
}

// The places in the queue that stay awake (byPlace): four, as with two
// the awake places emptied before the next sleeper woke, and the key
// waited for it (docs/fairness.md, "Sleepers").
const (
	awakePlaces = 4
	sleepPlaces = 8
)

// A pacing is what rulesPacer's rules remember of one primitive's waits
// and holds: its last wait (lastWait), its key's queue and token counters
// as last seen, how long turns and holds last. Every field, and every
// method that reads or writes one, is in this file.
type pacing struct {
	mu      sync.Mutex
	last    lastWait      // guarded by mu
	queue   int64         // guarded by mu
	waiting int           // guarded by mu: how many waiters were registered, as last seen
	awake   int           // guarded by mu: how many of them were awake
	counter counterSeen   // guarded by mu: the token counter as last seen to change, and when (sent: when the reply came)
	every   time.Duration // guarded by mu: how often the key changes hands, estimated
	turn    time.Duration // guarded by mu: a requeued wait's turn, per waiter ahead, as learnt (planTurn)
	busy    time.Duration // guarded by mu: how long its last requeued hold lasted, from acquire to release (planTurn)
	rtt     time.Duration // guarded by mu: the round trip of its acquires that took the key, the least seen lately (keep.go)
	held    time.Time     // guarded by mu: when its last Lock took the key
	hold    time.Duration // guarded by mu: how long its last hold lasted, from the Lock's return to the Unlock (keep.go)
	batch   time.Time     // guarded by mu: when the acquire was sent that began its last run of holds (keep.go)
	kept    bool          // guarded by mu: its last Lock took a hold its Unlock kept (keep.go)
	late    int           // guarded by mu: requeued waits in a row whose first attempt failed (tookTurn)

	freed    counterSeen // guarded by mu: when the last Unlock sent the write that freed the key, and the counter as it left it; zero if it kept the hold (planHead)
	unlocked time.Time   // guarded by mu: when the last Unlock returned (requeue.go)
	soon     bool        // guarded by mu: the last Lock began within the requeue window after the Unlock before it
}

// sawToken records the key's token counter t, seen at now, and updates
// the estimate of how often the key changes hands (a moving average).
// Tokens also count shared holds and spares: the estimate only paces
// polls.
func (p *pacing) sawToken(t Token, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.counter.sent.IsZero() && t > p.counter.token && now.After(p.counter.sent) {
		d := now.Sub(p.counter.sent) / time.Duration(t-p.counter.token)
		if p.every == 0 {
			p.every = d
		} else {
			p.every = (3*p.every + d) / 4
		}
	}
	if t != p.counter.token || p.counter.sent.IsZero() {
		p.counter = counterSeen{sent: now, token: t}
	}
}

// still returns how long before now the key's token counter was last
// seen to change (0 when it was never seen).
func (p *pacing) still(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.counter.sent.IsZero() {
		return 0
	}
	return now.Sub(p.counter.sent)
}

// token returns the key's token counter as last seen, and whether one
// was: a shared acquire is a compare-and-set on it, so a good guess saves
// a read.
func (p *pacing) token() (Token, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counter.token, !p.counter.sent.IsZero()
}

// period is the estimate of how often the key changes hands, 0 if none or
// if the token counter was last seen to move more than ttl before now.
func (p *pacing) period(now time.Time, ttl time.Duration) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.counter.sent.IsZero() || now.Sub(p.counter.sent) > ttl {
		return 0
	}
	return p.every
}

// queueGuess is the queue counter a requeue registers with: the one last
// seen, plus queueSlack. A requeue takes the number after its guess if the
// counter is at most the guess, so the slack lets it through when up to
// queueSlack waiters registered since the primitive last looked, which
// would otherwise cost a failed write and a read. Numbers stay unique and
// grow in the order registrations apply, which is all the queue needs of
// them (docs/design.md, rule 6).
func (p *pacing) queueGuess() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.queue + queueSlack
}

// queueSlack: see queueGuess. Two Clients that last saw the same counter
// guess the same: the first to requeue moves the counter to its guess
// plus one, past the other's guess, so the other's requeue fails. Its
// second try guesses queueSlack+1 higher, which is the first's number
// plus queueSlack, without reading the counter first. Without the slack,
// such a failure costs a plain release and a registration of the next
// Lock's own (docs/fairness.md prices it).
const queueSlack = 64

// sawQueue records the key's queue counter, how many waiters are
// registered and how many of them are awake, as r shows them.
func (p *pacing) sawQueue(r record) {
	awake := 0
	for _, e := range r.Waiters {
		if !e.Sleep {
			awake++
		}
	}
	p.mu.Lock()
	p.queue, p.waiting, p.awake = r.Queue, len(r.Waiters), awake
	p.mu.Unlock()
}

// sleepy reports whether a registration made now starts asleep: as
// rules' doze says for the waiters its primitive last saw registered, and
// the awake among them, who would all be ahead of it.
func (p *pacing) sleepy(rules pacer) bool {
	p.mu.Lock()
	n, awake := p.waiting, p.awake
	p.mu.Unlock()
	sleep, change := rules.doze(n, awake, false)
	return sleep && change
}

// start returns the backoff of a wait that begins at now (lastWait).
func (p *pacing) start(now time.Time, cfg *config) poller {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last.start(now, cfg)
}

// ended notes that a wait whose backoff had reached interval ended at now.
func (p *pacing) ended(interval time.Duration, now time.Time) {
	p.mu.Lock()
	p.last = lastWait{interval: interval, at: now}
	p.mu.Unlock()
}

// A schedule paces one wait: it decides when the wait sends its next
// command and, for an exclusive wait, whether that is an acquire attempt
// or a read. The wait tells it what it saw (registered, requeued, saw,
// planned, missed, failed, took); it reads none of the pacing's state.
// The wait reads besides, whatever the pacing says, when a watch comes
// due and to name holders in its trace: liveness and tracing are not the
// pacer's (waitPoll). A schedule is used by the waiting goroutine only.
type schedule struct {
	p     *pacing // the primitive's memory
	cfg   *config // the primitive's
	rules pacer
	polls *poller   // the backoff, from the first pause on
	plan  turnPlan  // a requeued wait's plan, or that of a head that saw its hold begin
	last  sighting  // the key's token counter as this wait (or the Unlock before it) last saw it
	an    anchor    // the wait's registration, on the server's clock and this Client's (heldSince)
	eta   time.Time // behind two or more waiters: when about one is left, estimated; zero for no estimate
	ahead int       // waiters ahead of it, as last seen
}

// exclusive returns the schedule of an exclusive wait of the primitive,
// paced by rules.
func (p *pacing) exclusive(cfg *config, rules pacer) schedule {
	f := p.takeFreed()
	return schedule{p: p, cfg: cfg, rules: rules, last: sighting{sent: f.sent, token: f.token}}
}

// shared returns the schedule of a shared wait: plain backoff, resumed
// where the primitive's last wait left it (lastWait), and the age rule.
func (p *pacing) shared(cfg *config, rules pacer) schedule {
	return schedule{p: p, cfg: cfg, rules: rules}
}

// contended reports whether the wait registers in the queue at once,
// before any attempt: the primitive's last wait ended less than a TTL
// before now, so an attempt would likely fail.
func (s *schedule) contended(now time.Time) bool {
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	return !s.p.last.at.IsZero() && now.Sub(s.p.last.at) < s.cfg.ttl
}

// spares reports whether the wait's attempts as a registered waiter
// reserve a spare token for a keep (keep.go).
func (s *schedule) spares() bool { return s.rules.uses(ruleKeep) && s.p.spare(s.cfg) }

// attempts reports whether the wait's next command is an acquire attempt
// rather than a read: at the head of the queue (or unregistered), or when
// its plan's attempts are due, asleep or not.
func (s *schedule) attempts(now time.Time, head bool) bool { return head || s.plan.due(now) }

// registered notes the reply r to the wait's own write (its registration,
// or the requeue that made it), sent at sent and answered at answered.
func (s *schedule) registered(r record, sent, answered time.Time) {
	s.an = anchorAt(r.At, sent, answered)
}

// requeued notes that the wait adopted the registration its primitive's
// Unlock made, which joined the queue at joined with k waiters ahead,
// after a hold that lasted busy: it plans its turn (planTurn).
func (s *schedule) requeued(joined time.Time, k int, busy time.Duration) {
	if s.rules.uses(ruleTurnPlan) {
		s.plan = s.rules.aim(s.p.planTurn(joined, k, busy, s.cfg))
	}
}

// saw notes r, the record a command sent at sent returned, read at now,
// with the wait registered or not, ahead waiters before it: a head that
// saw the hold it waits for begin plans its wait (planHead), unless the
// wait has a plan already (a requeued wait's, even once it ran out, is
// what teaches the next one: tookTurn); not for an RWMutex's writer (rw),
// as a reader's hold moves the counter too, and the writer clears crashed
// readers by reading, which a plan would put off.
func (s *schedule) saw(r record, sent, now time.Time, registered bool, ahead int, rw bool) {
	seen := sighting{sent: sent, token: r.Token, r: r}
	if s.plan == (turnPlan{}) && registered && ahead == 0 && !r.free() && !rw && s.rules.uses(ruleHeadPlan) {
		s.plan = s.rules.aim(s.p.planHead(s.last, seen, s.an, s.cfg))
	}
	s.last, s.ahead = seen, ahead
	s.eta = time.Time{}
	if period := s.p.period(now, s.cfg.ttl); period > 0 && ahead > 1 {
		// Each waiter ahead holds the key about a period: read again
		// when about one is left ahead.
		s.eta = now.Add(time.Duration(ahead-1)*period - period/2)
	}
}

// planned reports whether an attempt sent at sent was one of the plan's.
func (s *schedule) planned(sent time.Time) bool { return s.plan.due(sent) }

// missed notes that a planned attempt sent at sent found, at now, the key
// not yet the wait's; it reports whether the plan ran out, when the wait
// reads at once: it is late, and the key may be free and owed to it.
func (s *schedule) missed(sent, now time.Time) bool {
	s.plan.miss(sent, now)
	return !s.plan.on
}

// failed notes an attempt that failed otherwise than on a held key: the
// plan ends.
func (s *schedule) failed() { s.plan.on = false }

// took notes that the wait took the key at now, by an acquire sent at
// sent whose round trip was rtt, and whose reply was r; kept: by a keep's
// handoff write; registered: the wait had registered.
func (s *schedule) took(r record, sent, now time.Time, rtt time.Duration, kept, registered bool) {
	p := s.p
	p.sawToken(r.Token, now)
	p.sawQueue(r)
	p.tookTurn(s.plan, now)
	p.took(sent, now, rtt, kept)
	if s.polls != nil || registered {
		p.ended(s.polls.lastOrZero(), now)
	}
}

// ended notes that a shared wait ended at now.
func (s *schedule) ended(now time.Time) {
	if s.polls != nil {
		s.p.ended(s.polls.last, now)
	}
}

// next returns how long the wait sleeps before its next round, at now,
// registered or not, at the head or not, its registration marked asleep
// or not: as its plan says; or, asleep, by its place; or, registered,
// paced by how often the key changes hands (period); or on the backoff;
// and, awake and with no plan, no less than the hold's age allows (age).
func (s *schedule) next(now time.Time, registered, head, asleep bool) time.Duration {
	cfg := s.cfg
	if s.polls == nil {
		p := s.p.start(now, cfg)
		s.polls = &p
	}
	backoff := s.polls.next()
	d := backoff
	switch period := s.p.period(now, cfg.ttl); {
	case s.plan.on:
		d = max(s.plan.next.Sub(now), 0)
		if s.plan.head { // a head's plan keeps within the backoff's bounds: see WithBackoff
			d = min(d, cfg.maxBackoff)
		}
		return s.rules.sleep(d, backoff)
	case asleep:
		// No free key waits for it (record.queueOpen), so it sleeps by its
		// place, not on the backoff: half the turns until it is among the
		// awakePlaces, or twice as long as the key stood still, whichever
		// is longer, and at least a quarter of the minimum backoff.
		d = max(2*s.p.still(now), cfg.minBackoff/4)
		if period > 0 && s.ahead >= awakePlaces {
			d = max(d, time.Duration(s.ahead-awakePlaces+1)*period/2)
		}
		return s.rules.sleep(d, backoff)
	case !s.rules.uses(rulePeriod) || !registered:
	case period > 0 && head:
		// The key changes hands about every period: the head polls four
		// times a period.
		d = min(d, max(period/4, cfg.minBackoff/4))
	case period > 0 && now.Before(s.eta):
		// Until about one waiter is left ahead, but at most the maximum
		// backoff: a period estimated early, from a counter seen moving
		// a few times, can be far too long.
		d = min(max(s.eta.Sub(now), cfg.minBackoff), cfg.maxBackoff)
	case period > 0:
		// Next after the head: read every half period to learn when it
		// is the head.
		d = min(d, max(period/2, cfg.minBackoff/4))
	}
	if s.rules.uses(ruleAge) {
		d = max(d, s.age(now))
	}
	return s.rules.sleep(d, backoff)
}

// age is how late an awake wait may notice, at now, that the hold it
// waits behind ended: an eighth of how long the key's token counter has
// stood still (the hold's age, as far as the wait saw it begin), at most
// a quarter TTL. It reads about 8·ln(t2/t1) times between t1 and t2 into
// a hold (1.4 a second from 2 s to 12 s), and takes the key at most h/8
// late after a hold of h.
func (s *schedule) age(now time.Time) time.Duration {
	return min(s.p.still(now)/8, s.cfg.ttl/4)
}

// limit is the longest the wait sleeps at once at now, whatever its
// pacing planned (waitPoll): awake, a poll interval (maxSleep) or what
// the hold's age allows, whichever is longer; asleep, half a TTL, as the
// waiters ahead may give up meanwhile, and a free key waits for the first
// sleeper when no waiter behind it is awake (TestHeadAfterWaitersAheadLeft).
// The bounds on the dead rest on the watches, which wake a wait sooner.
func (s *schedule) limit(now time.Time, asleep bool) time.Duration {
	if asleep {
		return max(s.cfg.ttl/2, maxSleep(s.cfg))
	}
	return max(maxSleep(s.cfg), s.age(now))
}

// The keep's memory (keep.go).

// keepFactor: a hold is kept when it lasted less than keepFactor round
// trips of its primitive's acquires: long enough to keep 20 ms holds a
// millisecond from the server, where a hand-over costs as much as the
// hold (docs/fairness.md).
const keepFactor = 32

// took notes that a Lock of the primitive took the key by a write sent at
// sent, taking it at now: a hold an Unlock kept, or not (then the write
// was an acquire, whose round trip, rtt, it tracks, and which begins a run
// of holds). The round trip is the acquire's alone, without a new key's
// floor read, which would make long holds look short.
func (p *pacing) took(sent, now time.Time, rtt time.Duration, kept bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held, p.kept = now, kept
	if kept {
		return
	}
	p.batch = sent
	if p.rtt == 0 || rtt < p.rtt { // the least, drifting up as it ages
		p.rtt = rtt
	} else {
		p.rtt += (rtt - p.rtt) / 32
	}
}

// batchSince returns when the acquire was sent that began the primitive's
// run of holds that ends with a hold acquired (sent) at from: from itself,
// unless that hold was kept.
func (p *pacing) batchSince(from time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.kept && !p.batch.IsZero() {
		return p.batch
	}
	return from
}

// keeping reports whether an Unlock under contention keeps its hold for
// the primitive's next Lock: when the hold was short, and was not itself
// a kept one (keep.go).
func (p *pacing) keeping(cfg *config) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.kept && !cfg.hooks.flawed(flawKeepAlways) {
		return false // a kept hold is not kept again: the next turn is the queue's
	}
	return p.short(cfg)
}

// spare reports whether the primitive's next acquire as a registered
// waiter reserves a spare token: whether its last hold was short, so that
// its Unlock will likely keep the next. (Reserving one for every such
// acquire would move the token counter two a hold where none is kept, and
// the waiters' estimate of how often the key changes hands with it.)
func (p *pacing) spare(cfg *config) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.short(cfg)
}

// short reports, with p.mu held, whether the primitive's last hold was
// short: less than keepFactor round trips of its acquires (the least
// seen lately; each counted as at least a 32nd of the minimum backoff: a
// hand-over costs at least a waiter's poll, however near the server).
func (p *pacing) short(cfg *config) bool {
	return !p.held.IsZero() && p.hold < keepFactor*max(p.rtt, cfg.minBackoff/32)
}

// The requeue's memory (requeue.go).

// requeueWindow is how soon after an Unlock a primitive's next Lock must
// come for its Unlocks to requeue it, and how long a requeued registration
// waits for that Lock.
func requeueWindow(cfg *config) time.Duration { return cfg.minBackoff }

// relocking notes that a Lock of the primitive begins at now.
func (p *pacing) relocking(now time.Time, window time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.soon = !p.unlocked.IsZero() && now.Sub(p.unlocked) < window
}

// unlocking reports whether an Unlock of the primitive that begins at now
// should requeue: its last Lock came within the window after the Unlock
// before it returned, and had to wait less than a TTL ago. It notes how
// long the hold lasted (keep.go).
func (p *pacing) unlocking(now time.Time, cfg *config) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.held.IsZero() {
		p.hold = now.Sub(p.held)
	}
	p.freed = counterSeen{} // until freeing: the Unlock may keep the hold
	return p.soon && !p.last.at.IsZero() && now.Sub(p.last.at) < cfg.ttl
}

// ownHold is how long the primitive's holds last, as far as it knows,
// measured as busy is, from the acquire's send to the release's reply:
// its last requeued hold, or its last hold (from its Lock's return to its
// Unlock) and the two writes' round trips, whichever is longer; 0 if
// unknown.
func (p *pacing) ownHold() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hold == 0 {
		return p.busy
	}
	return max(p.busy, p.hold+2*p.rtt)
}

// freeing notes that an Unlock of the primitive sends, at now, the write
// that frees the key, whose token counter its hold left at t (planHead).
func (p *pacing) freeing(now time.Time, t Token) {
	p.mu.Lock()
	p.freed = counterSeen{sent: now, token: t}
	p.mu.Unlock()
}

// takeFreed returns what freeing last noted, and forgets it: the zero
// counterSeen if the last Unlock kept its hold, or if a Lock took it
// already.
func (p *pacing) takeFreed() counterSeen {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.freed
	p.freed = counterSeen{}
	return f
}

// unlockedAt notes that an Unlock of the primitive returned at now. The
// window is counted from there, not from when the Unlock began: its write
// may have waited behind other Clients' commands for longer than the
// window.
func (p *pacing) unlockedAt(now time.Time) {
	p.mu.Lock()
	p.unlocked = now
	p.mu.Unlock()
}

// The turn plans. A requeued wait (one that adopted the registration its
// primitive's Unlock made, requeue.go) knows when it joined the queue and
// how many waiters were ahead of it then (k). Under steady contention
// each of them takes the key about one turn after the one before, so
// rather than reading the document to learn when it reaches the head, it
// sends its first acquire attempt k turns after it joined, then retries
// a retry interval apart (turnRetry). The attempt's filter lets it take
// the key only once every waiter ahead is gone (rule 6 in
// docs/design.md), so an early attempt costs a failed command, never the
// order; and no sleep is longer than maxSleep, so a turn learnt too long
// costs latency, never the bounds of docs/fairness.md. A wait whose turn
// has not come after turnRetries attempts reads at once and goes back to
// the ordinary schedule, which watches the holder and the waiters ahead.
//
// A turn is learnt per primitive from its own waits (tookTurn): first
// guessed as its own hold, then moved earlier when a first attempt took
// the key, later when it failed.
//
// A wait that was not requeued plans too, once it is at the head and has
// seen the hold it waits for begin (planHead): a Client's first Locks
// under contention, before its Unlocks requeue.

// turnRetries is how many attempts a planned wait makes before it falls
// back to the ordinary schedule.
const turnRetries = 8

// maxSleep is the longest a wait sleeps at once, whatever its pacing
// planned, while the key changes hands (schedule.limit): the longest sleep
// of the ordinary schedule, the maximum backoff jittered up by half
// (backoff.go), so that every liveness bound that allows a poll interval
// (a crashed holder, a crashed, cut-off or cancelled waiter ahead) holds
// for a planned wait too.
func maxSleep(cfg *config) time.Duration { return cfg.maxBackoff + cfg.maxBackoff/2 }

// A turnPlan is one planned wait's schedule: a requeued wait's
// (planTurn), or that of a head that saw its hold begin (planHead). The
// zero value is no plan. It is used by the acquiring goroutine only.
type turnPlan struct {
	on     bool          // attempts follow the plan
	joined time.Time     // when the wait joined the queue, the requeue's reply; for a head's plan, when the hold began, as estimated
	k      int           // waiters ahead of it then; 0 for no plan
	next   time.Time     // when the next attempt is due
	retry  time.Duration // between attempts after the first
	failed int           // attempts that found the key not yet its turn
	head   bool          // a plan of planHead's: retries double, and no sleep before next is longer than the maximum backoff
}

// due reports whether the plan's attempts are due at now: a head's plan
// attempts whenever it wakes (it sleeps at most the maximum backoff at a
// time); a requeued wait's, from when its turn is due. A requeued wait
// that maxSleep, or a watch come due, woke before that polls as an
// unplanned wait does (the head with an attempt, a waiter behind it by
// reading the document, which clears crashed waiters ahead and watches
// the holder), and the plan stands.
func (tp *turnPlan) due(now time.Time) bool { return tp.on && (tp.head || !now.Before(tp.next)) }

// planTurn returns the schedule of a wait that joined the queue at
// joined with k waiters ahead of it, after a hold of its primitive that
// lasted busy from its acquire's send to its release's reply; no plan
// (the zero turnPlan) when none is ahead.
func (p *pacing) planTurn(joined time.Time, k int, busy time.Duration, cfg *config) turnPlan {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.busy = busy
	if p.turn == 0 {
		p.turn = busy // as first guess, the others hold the key as long as this primitive does
	}
	if k == 0 || p.turn <= 0 {
		return turnPlan{}
	}
	return turnPlan{on: true, joined: joined, k: k, next: joined.Add(time.Duration(k) * p.turn), retry: turnRetry(p.turn, cfg)}
}

// turnRetry is the interval between a planned wait's attempts, for turns
// of about u: a sixteenth of a turn, within the backoff's bounds. A retry
// that comes late leaves the key free, owed to the waiter, until it
// comes; one that comes early costs a command.
func turnRetry(u time.Duration, cfg *config) time.Duration {
	return min(max(u/16, cfg.minBackoff/16), cfg.maxBackoff/2)
}

// miss notes that an attempt sent at sent found the key not yet the
// wait's, at now; after turnRetries of them the plan ends. The next
// attempt waits the retry interval, and at least the round trip of this
// one: waiters that all aimed early must not fill a server that runs one
// command at a time with misses, or the holder's own commands queue
// behind them and every turn is late.
func (tp *turnPlan) miss(sent, now time.Time) {
	if tp.head && sent.Before(tp.next) {
		return // sent early, at the maximum backoff: the plan stands
	}
	tp.failed++
	tp.next = now.Add(max(tp.retry, now.Sub(sent)))
	if tp.head {
		tp.retry *= 2 // see planHead
	}
	if tp.failed >= turnRetries {
		tp.on = false
	}
}

// tookTurn learns from a requeued wait's plan (tp) that took the key at
// now. A first attempt that took the key moves the next aim earlier, by a
// quarter of a retry interval or half the way down to the primitive's own
// hold (busy), whichever is more: the pull towards the hold is what keeps
// a queue of waiters that all aim late from settling in a slow rhythm, as
// each one's wait would show the others' lateness. A first attempt that
// failed moves the aim later, by half a retry interval, doubled for each
// such wait in a row, but never past a retry interval before when this
// wait took the key.
//
// With one waiter ahead (two Clients taking turns), the turn is the other
// Client's hold plus the time it took to come, so the steps are smaller
// when early (a sixteenth of a retry, or half the way to the own hold
// plus a retry) and a failure moves the aim up to when the wait took the
// key: a late aim there costs at most a retry interval and holds up no
// one else.
func (p *pacing) tookTurn(tp turnPlan, now time.Time) {
	if tp.k == 0 {
		return
	}
	k := time.Duration(tp.k)
	p.mu.Lock()
	defer p.mu.Unlock()
	u := p.turn
	step := tp.retry / 2 / k
	if tp.on && tp.failed == 0 { // the first attempt took it: aim earlier
		if tp.k == 1 {
			u -= max(step/8, (u-p.busy-tp.retry)/2)
		} else {
			u -= max(step/2, (u-p.busy)/2)
		}
		p.late = 0
	} else { // later, but not later than it took the key
		ceil := (now.Sub(tp.joined) - tp.retry) / k // at the last attempt that failed, about
		if tp.k == 1 {
			ceil = now.Sub(tp.joined)
		}
		u = max(u, min(u+step<<min(p.late, 8), ceil))
		p.late++
	}
	p.turn = max(u, time.Microsecond)
}

// A sighting is a key's token counter as a wait saw it, and when the
// command that showed it was sent; with the record it was in, when there
// was one (an Unlock's freeing write returns none).
type sighting struct {
	sent  time.Time
	token Token
	r     record // Rev 0: none
}

// A counterSeen is a sighting without its record: what a pacing keeps
// between waits (two records in every primitive were over half its heap).
type counterSeen struct {
	sent  time.Time
	token Token
}

// An anchor is a moment that both the server's clock and this Client's
// clock saw: a write of the wait's own (its registration, or the requeue
// that made it), stamped by the server (record.At), and sent and answered
// within half a round trip (half) of local.
type anchor struct {
	server, local time.Time
	half          time.Duration
}

// anchorAt returns the anchor of a write sent at sent and answered at
// answered, which the server stamped at.
func anchorAt(at, sent, answered time.Time) anchor {
	half := answered.Sub(sent) / 2
	return anchor{server: at, local: sent.Add(half), half: half}
}

// heldSince returns when, on this Client's clock, the hold that now's
// record shows began, if the record tells: when last's record showed the
// key free, and the hold's acquire is the only write to it since (its
// stamp, record.At, is then the acquire's), and a write of the wait's own
// (an) maps the server's clock onto this Client's. The two clocks are not
// compared: the time between two stamps, on the server's clock, is added
// to when the anchor's write was made, on this one. ok is false when the
// record does not tell: no anchor; the key held when last looked (its
// release and the next acquire are two writes, as are a takeover and the
// new holder's first extension); or other writes since (a revision more
// than the acquire's, a waiter that registered, left or was extended,
// other than the acquirer's own registration, which its acquire ends).
func heldSince(last, now sighting, an anchor) (began time.Time, ok bool) {
	lr, r := last.r, now.r
	if an.server.IsZero() || lr.Rev == 0 || !lr.free() || r.Rev != lr.Rev+1 || r.Queue != lr.Queue ||
		r.Owner == "" || now.token != last.token+1 || r.At.Before(an.server) {
		return time.Time{}, false
	}
	acquirer, kept := holdKey(r.Owner, r.Hold), 0
	for hk, e := range lr.Waiters {
		e2, ok := r.Waiters[hk]
		if ok == (hk == acquirer) || ok && (e2.Stored != e.Stored || e2.Epoch != e.Epoch) {
			return time.Time{}, false
		}
		if ok {
			kept++
		}
	}
	if len(r.Waiters) != kept {
		return time.Time{}, false
	}
	// The anchor's local time is its write's within half its round trip,
	// and the server stamps to the millisecond; and the hold began after
	// last's command ran, before now's did, which may be up to a round
	// trip after it was sent: allow for that, and put the start within
	// the sends (an aim at most a round trip early).
	slack := max(5*time.Millisecond, an.half)
	began = an.local.Add(r.At.Sub(an.server))
	if began.Before(last.sent.Add(-slack)) || began.After(now.sent.Add(slack)) {
		return time.Time{}, false // the clocks do not agree (a step, another server): leave it
	}
	switch {
	case began.Before(last.sent):
		began = last.sent
	case began.After(now.sent):
		began = now.sent
	}
	return began, true
}

// planHead returns the schedule of a wait at the head of the queue whose
// command sent at now.sent showed the key held under token counter
// now.token, when it had last seen the counter, in a reply to a command
// sent at last.sent (or freed it, in the Unlock before), at last.token:
// no plan (the zero turnPlan) unless the counter is one more, so that
// the hold it waits for is the one hold that began between the two
// sends. When the record tells when it began (heldSince, with an, a
// write of the wait's own), the plan starts from then; otherwise from
// the sends' midpoint, and only if they were at most a quarter of a
// hand-over period apart: the midpoint could otherwise be later than the
// hold's start by more than the head's polls, four a period, would be.
// The hold is due to end a hand-over period after it began, or a hold of
// the wait's own Mutex, if that is shorter but at least a third of the
// period: as Clients start, the period counts the time the key sat free
// while their first waits polled on the backoff, and an aim that late
// leaves the key free again; far shorter own holds say little of the
// others'. The wait sends
// its first attempt then, rather than polling four times a period, and
// retries as a requeued wait does, but each retry twice as long after
// the last (the hold may be longer than estimated); it sleeps at most
// the maximum backoff at a time, as the ordinary schedule does, and an
// attempt sent early so does not count as a miss. The plan teaches
// tookTurn nothing (k is 0).
func (p *pacing) planHead(last, now sighting, an anchor, cfg *config) turnPlan {
	if last.sent.IsZero() || now.token != last.token+1 || now.sent.Before(last.sent) {
		return turnPlan{}
	}
	period := p.period(now.sent, cfg.ttl)
	window := now.sent.Sub(last.sent)
	began, exact := heldSince(last, now, an)
	if !exact {
		began = last.sent.Add(window / 2)
	}
	if period <= 0 || !exact && window > period/4 {
		return turnPlan{}
	}
	hold := period
	if own := p.ownHold(); own >= period/3 {
		hold = min(hold, own)
	}
	if !began.Add(hold).After(now.sent) {
		return turnPlan{}
	}
	return turnPlan{on: true, joined: began, next: began.Add(hold), retry: turnRetry(hold, cfg), head: true}
}
