package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// An Election elects a leader among the Clients that campaign under one
// name: at most one of them leads at a time, across all Clients and
// processes sharing the collection, and each term of leadership is a
// [Lease] with a fencing token greater than every earlier term's. The
// leader publishes a value (an address, say) that anyone can read with
// [Election.Leader] or follow with [Election.Observe], and change with
// [Election.Proclaim] while it leads. It resigns with [Lease.Release], which
// frees the name even when given a ctx that has ended, as [Mutex.Unlock]
// does.
//
// An Election is an exclusive hold on the key name, as a [Mutex]'s, with
// the leader's value as the hold's data (at most [MaxDataLen] bytes), so
// it keeps the Mutex's guarantees: a leader that crashes or is cut off
// from the server is replaced at most a TTL after a campaigner first saw
// its last write (plus a poll interval), so at most two TTLs after that
// write; and the old leader's Lease is lost ([Lease.Lost] closes,
// [Lease.Context] is cancelled) at its local deadline, before the next
// leader can be elected. A brief failure of the leader's extensions does
// not end its term: the lease is only lost at its local deadline, and an
// extension that gets through before then keeps it. A leader whose
// process was paused past its deadline may still act on what it leads
// when it wakes, before it checks its Lease: fence its writes with the
// term's token (see the package documentation).
//
// A name used by an Election must not be used by another kind of
// primitive: a Campaign or Leader that finds it so, and a Mutex,
// RWMutex or Semaphore that finds it used by an Election, return an error
// matching [ErrKindMismatch]. [WithData] does not apply to an Election: the
// value given to Campaign is the hold's data.
//
// Goroutines of one Client campaigning under the same name queue in the
// Client, as for a Mutex, and only the first of them talks to the server;
// when the leader among them resigns, leadership passes to the next of
// them (with its value and a new token) in one command.
//
// An Election is safe for concurrent use. Make one with
// [Client.NewElection]; the zero value's calls return [ErrNoClient] (its
// Proclaim [ErrNotHeld], its Observe a closed channel).
type Election struct {
	c    *Client // set by NewElection; never changes
	name string
	cfg  config
	err  error // invalid name or options

	pace pacing // what its waits and holds taught it (pacer.go)

	mu    sync.Mutex
	lease *Lease // guarded by mu: the last term won by Campaign, until resigned
}

// A Leader is the leader of an election, as one read of its key showed it.
type Leader struct {
	// Value is the leader's value: what it campaigned with, or what it
	// last proclaimed.
	Value string
	// Owner is the leading Client's identity ([Client.Owner]). In what
	// [Election.Observe] delivers, "" means that nobody leads.
	Owner string
	// Token is the term's fencing token: it strictly increases with each
	// new term, so a store that rejects stale tokens ([Fence]) turns away
	// the writes of a leader whose term has ended.
	Token Token
	// TraceID and SpanID name the span of the Campaign that began the
	// term, as [Holder] has them; zero when the term stored none.
	TraceID trace.TraceID
	SpanID  trace.SpanID
}

// NewElection returns an Election under name (its key). Options given
// here override the Client's for this Election; [WithTTL] sets how long a
// term outlives a leader that stopped extending it, and
// [WithObserveInterval] how often Observe reads. An invalid name or option
// is reported by its first call ([ErrInvalidKey], [ErrInvalidOption]).
func (c *Client) NewElection(name string, opts ...Option) *Election {
	e := &Election{c: c, name: name}
	e.cfg, e.err = c.configFor(name, opts)
	return e
}

// Name returns the Election's name, which is its key.
func (e *Election) Name() string { return e.name }

// Lease returns the lease of the term that this Election's last Campaign
// won, or nil when it has not won one, has resigned since, or the term was
// lost (its Err is not nil): a lost term is the Election's no more, as a
// lost lease is a [Mutex]'s.
func (e *Election) Lease() *Lease {
	return stillHeld(e.term())
}

// term returns the last term won by Campaign, lost or not, until it is
// resigned.
func (e *Election) term() *Lease {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lease
}

// Campaign blocks until this Client leads the election with value, or ctx
// ends, and returns the term's lease: it is extended in the background,
// and leadership ends when the lease does (resign with [Lease.Release];
// a lost lease is a lost term). It waits as [Mutex.Lock] does: it polls the
// server while another Client leads, and takes over from a leader that
// stopped extending its term once the TTL has passed. Like a Mutex, an
// Election is not reentrant: a Campaign while this Client leads under the
// name waits until that term is resigned. A term of this Election's that
// was lost is given back first (as [Lease.Release] does, at once), so
// that a loop that campaigns again when its term ends does not wait for
// itself; a lost term of another Election of the Client under the same
// name must be released to let others of the Client campaign.
//
// When ctx ends first, Campaign returns an error matching ctx.Err() with
// [errors.Is] and wrapping a [*WaitError] (who led, the last error from
// the server), and leaves nothing held (a term its last write may have won
// is given back in the background). When the Client is closed, or closes
// meanwhile, it returns [ErrClosed]. A value longer than [MaxDataLen]
// bytes returns [ErrInvalidOption] with no command sent.
func (e *Election) Campaign(ctx context.Context, value string) (*Lease, error) {
	if err := e.check(ctx, value); err != nil {
		return nil, keyError("campaign", e.Name(), err)
	}
	giveBackLost(ctx, e.term()) // give its place in the Client's queue up, at once
	cl := claim{lk: e, cfg: &e.cfg, pace: &e.pace,
		attempt: attempt{key: e.name, ttl: e.cfg.ttl, data: []byte(value), kind: e.kind()}}
	l, err := e.c.lockExclusive(ctx, cl, "dlock.Campaign", false)
	if err != nil {
		return nil, keyError("campaign", e.name, err)
	}
	l.settle(ctx) // Leader reads a raw record as led by nobody
	e.mu.Lock()
	e.lease = l
	e.mu.Unlock()
	return l, nil
}

// Leader returns the election's leader, as one read of its key shows it,
// and an error matching [ErrNoLeader] when nobody leads. It reports what
// the key's document says: a leader that crashed is reported until another
// Client's Campaign replaces it (within the bound in [Election]); the
// first term under a name is not reported until its Campaign has written
// the term's token, counted from the collection's floor (see
// [Client.Prune]), which it does before it returns.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	if err := e.check(ctx, ""); err != nil {
		return Leader{}, keyError("leader of", e.Name(), err)
	}
	if err := e.c.begin(); err != nil {
		return Leader{}, keyError("leader of", e.name, err)
	}
	defer e.c.finish()
	r, err := e.c.store.read(ctx, e.name)
	if err != nil {
		return Leader{}, err
	}
	return leaderOf(e.name, r)
}

// leaderOf is the leader that r shows for the election name.
func leaderOf(name string, r record) (Leader, error) {
	switch {
	case r.Rev != 0 && r.Kind != kindElection:
		return Leader{}, kindError(name, kindElection, r.Kind)
	case r.Owner == "" || r.Raw:
		return Leader{}, fmt.Errorf("%w in %q", ErrNoLeader, name)
	}
	return Leader{Value: string(r.Data), Owner: r.Owner, Token: r.Token, TraceID: r.Trace.traceID, SpanID: r.Trace.spanID}, nil
}

// Proclaim changes the leader's value to value without ending the term:
// one write, conditional on this Election's term still holding the key,
// that keeps the term's token. Once it returns nil, [Lease.Data] and
// every later read of the key ([Election.Leader], Observe,
// [Client.Holders]) show the new value.
//
// It returns an error matching [ErrNotHeld] when this Election does not
// lead (it has won no term, or resigned), and a [*LeaseLostError] when
// its term was lost, or the write shows that the key was taken over (the
// lease then ends as lost). When it fails for want of an answer from the
// server, the key may show either value; Proclaim again. The write counts
// as a sign of life of the term for Clients waiting to take over (it
// changes the document's revision, as an extension does), but does not
// extend the term's lease: its deadline stays where the last extension
// put it.
//
// With [WithMaxHold], no write of a term comes later than its last
// extension, which is due a TTL (and 1% of it) before the cap: from then
// on Proclaim sends nothing and returns an error matching [ErrMaxHold],
// while the term still leads until its lease is lost at the cap. A write
// then would be a sign of life that puts off the Clients waiting to take
// over, by up to a TTL beyond the cap.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	if e == nil || e.c == nil {
		return ErrNotHeld
	}
	if err := e.check(ctx, value); err != nil {
		return keyError("proclaim", e.name, err)
	}
	l := e.term()
	if l == nil {
		return keyError("proclaim", e.name, ErrNotHeld)
	}
	if err := l.Err(); err != nil {
		return e.notLeading(err)
	}
	if !l.stop.IsZero() && !e.c.clock.Now().Before(l.lastDue) {
		return errorf("dlock: proclaim %q: %w: the term writes nothing after its last extension", e.name, ErrMaxHold)
	}
	if err := e.c.begin(); err != nil {
		return keyError("proclaim", e.name, err)
	}
	defer e.c.finish()
	data := []byte(value)
	err := e.c.store.setData(ctx, l.ref(), data)
	switch {
	case err == nil:
		l.setData(data)
		return nil
	case errors.Is(err, errNotOwner):
		return e.notLeading(l.steal())
	case ctx.Err() != nil:
		return keyError("proclaim", e.name, ctx.Err())
	}
	return err
}

// notLeading is Proclaim's error for a term that ended with err.
func (e *Election) notLeading(err error) error {
	if errors.Is(err, ErrReleased) { // resigned, or ended by Close
		err = ErrNotHeld
	}
	return keyError("proclaim", e.name, err)
}

// kind is the kind of the Election's key (see kindOf).
func (e *Election) kind() string { return kindElection }

// check reports misuse, or a ctx already ended, before any command.
func (e *Election) check(ctx context.Context, value string) error {
	switch {
	case e == nil || e.c == nil:
		return ErrNoClient
	case e.err != nil:
		return e.err
	case len(value) > MaxDataLen:
		return fmt.Errorf("%w: value of %d bytes, more than %d", ErrInvalidOption, len(value), MaxDataLen)
	}
	return ctx.Err()
}

// forget clears the Election's lease if it is l (a resignation).
func (e *Election) forget(l *Lease) {
	e.mu.Lock()
	if e.lease == l {
		e.lease = nil
	}
	e.mu.Unlock()
}

// Observe returns a channel that delivers the election's leader as one
// read of its key shows it, then every change of leader or of its value,
// in order and without repeats; a Leader whose Owner is "" means that
// nobody leads (the key is free, or used by another kind of primitive).
// The channel is closed when ctx ends or the Client closes (at once when
// either has already happened, or the Election is invalid).
//
// Observe polls: each Client reads the key once per interval
// ([WithObserveInterval], default [DefaultObserveInterval]; the shortest
// any of its observers asked for), however many goroutines observe the
// election through it, in one goroutine that runs while any of them
// does. So a change reaches an observer at most about an interval after
// the key's document shows it; a second Observe of the same election
// through the same Client starts from the state of the last read. A
// failed read reports nothing, and the next interval reads again.
//
// An observer that receives as fast as changes come sees each of them;
// one that lags sees the newest state when it next receives (changes in
// between are coalesced), never an older one. Like Leader, Observe
// reports what the document says: a leader that crashed is reported
// until it is replaced.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	out := make(chan Leader)
	if e.check(ctx, "") != nil {
		close(out)
		return out
	}
	c := e.c
	ob := &observer{every: e.cfg.observe, wake: make(chan struct{}, 1)}
	c.mu.Lock()
	if !c.observing.add() {
		c.mu.Unlock()
		close(out)
		return out
	}
	o := c.observations[e.name]
	start := o == nil
	if start {
		c.observing.add() // the poller's; not closed, as just checked under the same lock
		o = &observation{key: e.name, subs: map[*observer]struct{}{}}
		o.ctx, o.cancel = context.WithCancel(context.Background())
		c.observations[e.name] = o
	}
	o.subs[ob] = struct{}{}
	if o.known {
		ob.latest, ob.has = o.state, true
		ob.wake <- struct{}{}
	}
	c.mu.Unlock()
	if start {
		go c.poll(o)
	}
	go c.forward(ctx, o, ob, out)
	return out
}

// An observation is a Client's watch on one election's key, shared by all
// the Observe calls on it through the Client: one goroutine (poll) reads
// the key once per interval and passes each change to the observers. It
// runs until the last observer leaves, or Close, which waits for it.
type observation struct {
	key    string
	ctx    context.Context    // cancelled when the last observer leaves, or by Close; ends the poller
	cancel context.CancelFunc // called with Client.mu held

	subs  map[*observer]struct{} // guarded by Client.mu: the observers
	state Leader                 // guarded by Client.mu: as the last successful read showed it
	known bool                   // guarded by Client.mu: a read has succeeded
}

// An observer is one Observe call: its goroutine (forward) passes the
// latest state the poller gave it to the caller's channel.
type observer struct {
	every  time.Duration // the interval this observer asked for
	wake   chan struct{} // buffered: latest changed
	latest Leader        // guarded by Client.mu: the newest state
	has    bool          // guarded by Client.mu: latest is set
}

// poll reads o's key once per interval, and gives each change to every
// observer, until o.ctx ends.
func (c *Client) poll(o *observation) {
	defer func() {
		c.mu.Lock()
		c.observing.done()
		c.mu.Unlock()
	}()
	for {
		r, err := c.store.read(o.ctx, o.key)
		if o.ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		if err == nil {
			l, lerr := leaderOf(o.key, r)
			if lerr != nil {
				l = Leader{} // nobody leads: free, or not an election's key
			}
			if !o.known || l != o.state {
				o.state, o.known = l, true
				for ob := range o.subs {
					ob.latest, ob.has = l, true
					select {
					case ob.wake <- struct{}{}:
					default: // woken already: it reads latest when it runs
					}
				}
			}
		}
		every := time.Duration(0)
		for ob := range o.subs {
			if every == 0 || ob.every < every {
				every = ob.every
			}
		}
		c.mu.Unlock()
		if every == 0 { // no observer left: o.ctx is cancelled
			return
		}
		t := c.clock.NewTimer(every)
		select {
		case <-t.C:
		case <-o.ctx.Done():
			t.Stop()
			return
		}
	}
}

// forward passes ob's latest state to out whenever it differs from the
// last state out took, until ctx ends or the Client closes; then it closes
// out, and the last observer of o to leave stops o's poller.
func (c *Client) forward(ctx context.Context, o *observation, ob *observer, out chan<- Leader) {
	defer func() {
		close(out)
		c.mu.Lock()
		delete(o.subs, ob)
		if len(o.subs) == 0 {
			o.cancel()
			if c.observations[o.key] == o {
				delete(c.observations, o.key)
			}
		}
		c.observing.done()
		c.mu.Unlock()
	}()
	latest := func() (Leader, bool) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return ob.latest, ob.has
	}
	var sent Leader // the last state out took
	first := true
	for {
		select {
		case <-ob.wake:
		case <-ctx.Done():
			return
		case <-c.closing:
			return
		}
		v, has := latest()
	send:
		for has && (first || v != sent) {
			select {
			case out <- v:
				sent, first = v, false
				break send
			case <-ob.wake: // a newer state while the observer lags: offer that instead
				v, has = latest()
			case <-ctx.Done():
				return
			case <-c.closing:
				return
			}
		}
	}
}
