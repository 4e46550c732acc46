package dlock

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A slowStore answers every command after a fixed delay, as a server a
// round trip away would: inside a synctest bubble, turns then take as long
// as they would against a server, in no real time.
type slowStore struct {
	store
	rtt time.Duration
}

func (s slowStore) wait() { time.Sleep(s.rtt) }
func (s slowStore) acquire(ctx context.Context, a attempt, at stamp) (record, error) {
	s.wait()
	return s.store.acquire(ctx, a, at)
}
func (s slowStore) readMany(ctx context.Context, keys []string) ([]record, error) {
	s.wait()
	return s.store.readMany(ctx, keys)
}
func (s slowStore) read(ctx context.Context, key string) (record, error) {
	s.wait()
	return s.store.read(ctx, key)
}
func (s slowStore) register(ctx context.Context, a attempt) (record, error) {
	s.wait()
	s.wait() // two writes (store.register)
	return s.store.register(ctx, a)
}
func (s slowStore) requeue(ctx context.Context, ref leaseRef, next attempt) (record, error) {
	s.wait()
	return s.store.requeue(ctx, ref, next)
}
func (s slowStore) release(ctx context.Context, ref leaseRef) error {
	s.wait()
	return s.store.release(ctx, ref)
}

// TestTurnPlanCommands: Clients that take turns at a key under steady
// contention spend at most three commands an acquisition: the
// Unlock's requeue, the acquire that takes the key, the acquires that came
// too early, and, every other turn, the handoff of a kept hold (keep.go).
// A requeued wait sends its attempts when its turn is due (pacer.go, planTurn)
// instead of reading the document to learn when it reaches the head;
// without that and the keep (backoffPacer, dlock before turn plans and
// keep.go) the same run costs more, which shows the check has teeth. The commands are counted after a few rounds, once the waits
// have learnt how long a turn is. (The order of the turns is checked by
// TestFairQueueNoStarvation and, on every write, by the simulation.)
func TestTurnPlanCommands(t *testing.T) {
	const (
		n      = 6
		warmup = 10
		rounds = 50
		hold   = 20 * time.Millisecond
		rtt    = time.Millisecond
	)
	for _, tc := range []struct {
		name      string
		opts      []Option
		wantCheap bool
	}{
		{"turn plan", nil, true},
		{"no turn plan", []Option{withPacer(backoffPacer{})}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newMemStore()
				var hs []*hooked
				var ms []*Mutex
				for range n {
					c, h := memClient(t, slowStore{st, rtt}, tc.opts...)
					hs = append(hs, h)
					ms = append(ms, c.NewMutex("k"))
				}
				count := func() map[string]int {
					m := map[string]int{}
					for _, h := range hs {
						for _, op := range []string{"acquire", "read", "register", "requeue", "release", "reap", "handoff", "mark"} {
							m[op] += h.count(op)
						}
					}
					return m
				}
				ringRounds(t, ms, warmup, hold) // the waits learn how long a turn is
				before := count()
				order := ringRounds(t, ms, rounds, hold)
				require.Len(t, order, n*rounds)
				cmds := 0
				for op, k := range count() {
					cmds += k - before[op]
					t.Logf("%s: %d", op, k-before[op])
				}
				per := float64(cmds) / float64(len(order))
				t.Logf("%d commands for %d acquisitions: %.2f each", cmds, len(order), per)
				assert.Equal(t, tc.wantCheap, per <= 3, "at most 3 commands an acquisition: %.2f", per)
			})
		})
	}
}

// TestTookTurn: how a requeued wait's outcome moves the next one's aim.
func TestTookTurn(t *testing.T) {
	cfg := defaultConfig()
	joined := time.Unix(1000, 0)
	const k = 4
	plan := func(p *pacing) turnPlan { return p.planTurn(joined, k, 10*time.Millisecond, &cfg) }
	t.Run("first guess is the hold", func(t *testing.T) {
		var p pacing
		tp := plan(&p)
		require.True(t, tp.on)
		assert.Equal(t, joined.Add(k*10*time.Millisecond), tp.next)
	})
	t.Run("first guess is the hold, at once with one ahead", func(t *testing.T) {
		var p pacing
		tp := p.planTurn(joined, 1, 10*time.Millisecond, &cfg)
		require.True(t, tp.on)
		assert.Equal(t, joined.Add(10*time.Millisecond), tp.next)
	})
	t.Run("no plan with no one ahead", func(t *testing.T) {
		var p pacing
		assert.False(t, p.planTurn(joined, 0, 10*time.Millisecond, &cfg).on)
	})
	t.Run("first attempt took it: earlier, towards the hold", func(t *testing.T) {
		p := pacing{turn: 30 * time.Millisecond, busy: 10 * time.Millisecond}
		tp := p.planTurn(joined, k, 10*time.Millisecond, &cfg)
		p.tookTurn(tp, tp.next.Add(time.Millisecond))
		// Half way down to the hold: 30 - (30-10)/2.
		assert.Equal(t, 20*time.Millisecond, p.turn)
		tp = p.planTurn(joined, k, 10*time.Millisecond, &cfg)
		p.tookTurn(tp, tp.next.Add(time.Millisecond))
		assert.Equal(t, 15*time.Millisecond, p.turn)
		for range 20 { // near the hold, by quarter retry intervals, and past it
			tp = p.planTurn(joined, k, 10*time.Millisecond, &cfg)
			p.tookTurn(tp, tp.next.Add(time.Millisecond))
		}
		assert.Less(t, p.turn, 10*time.Millisecond)
	})
	t.Run("one ahead: earlier by a sixteenth of a retry, pulled to a retry past the hold", func(t *testing.T) {
		p := pacing{turn: 30 * time.Millisecond, busy: 10 * time.Millisecond}
		tp := p.planTurn(joined, 1, 10*time.Millisecond, &cfg)
		require.True(t, tp.on)
		p.tookTurn(tp, tp.next.Add(time.Millisecond))
		// Half way down to the hold plus a retry interval, not to the hold.
		assert.Equal(t, 30*time.Millisecond-(30*time.Millisecond-10*time.Millisecond-tp.retry)/2, p.turn)
		// Within a retry interval of the hold plus one: a sixteenth of an
		// interval earlier (with more ahead, half the way to the hold).
		p.turn = 10700 * time.Microsecond
		tp = p.planTurn(joined, 1, 10*time.Millisecond, &cfg)
		p.tookTurn(tp, tp.next.Add(time.Millisecond))
		assert.Equal(t, 10700*time.Microsecond-tp.retry/16, p.turn)
	})
	t.Run("failed waits in a row: each step twice the last", func(t *testing.T) {
		p := pacing{turn: 10 * time.Millisecond, busy: 10 * time.Millisecond}
		far := joined.Add(time.Hour) // took the key long after: no ceiling
		for i := range 3 {
			before := p.turn
			tp := p.planTurn(joined, k, 10*time.Millisecond, &cfg)
			tp.miss(tp.next, tp.next)
			p.tookTurn(tp, far)
			assert.Equal(t, tp.retry/2/k<<i, p.turn-before, "wait %d: half a retry interval, doubled %d times", i, i)
		}
	})
	t.Run("a retry waits at least the missed attempt's round trip", func(t *testing.T) {
		p := pacing{turn: 10 * time.Millisecond}
		tp := p.planTurn(joined, k, 10*time.Millisecond, &cfg)
		require.Less(t, tp.retry, 5*time.Millisecond)
		sent := tp.next
		tp.miss(sent, sent.Add(5*time.Millisecond))
		assert.Equal(t, sent.Add(10*time.Millisecond), tp.next, "the answer came after 5 ms: 5 ms more")
	})
	t.Run("first attempt failed: later, not past when it took the key", func(t *testing.T) {
		p := pacing{turn: 10 * time.Millisecond, busy: 10 * time.Millisecond}
		tp := p.planTurn(joined, k, 10*time.Millisecond, &cfg)
		sent := tp.next
		tp.miss(sent, sent.Add(time.Millisecond))
		took := tp.next.Add(time.Millisecond)
		p.tookTurn(tp, took)
		assert.Greater(t, p.turn, 10*time.Millisecond)
		assert.LessOrEqual(t, joined.Add(k*p.turn), took, "aims past when the key was taken")
		for range 20 { // failing again and again: later each time, but never past that
			tp = p.planTurn(joined, k, 10*time.Millisecond, &cfg)
			tp.miss(tp.next, tp.next)
			p.tookTurn(tp, took)
			assert.LessOrEqual(t, joined.Add(k*p.turn), took)
		}
	})
	t.Run("one ahead, first attempt failed: a full step later, up to when it took the key", func(t *testing.T) {
		// The retry took the key one retry interval after the failed
		// attempt. With more ahead the aim stays a retry interval before
		// that (at the failed attempt); with one ahead it moves the whole
		// step, so that the next first attempt is not at the edge again.
		p := pacing{turn: 300 * time.Millisecond, busy: 300 * time.Millisecond}
		tp := p.planTurn(joined, 1, 300*time.Millisecond, &cfg)
		require.True(t, tp.on)
		tp.miss(tp.next, tp.next.Add(time.Millisecond))
		took := tp.next.Add(time.Millisecond)
		p.tookTurn(tp, took)
		assert.Equal(t, 300*time.Millisecond+tp.retry/2, p.turn)
		for range 20 { // failing again and again: later each time, but never past when it took the key
			tp = p.planTurn(joined, 1, 300*time.Millisecond, &cfg)
			tp.miss(tp.next, tp.next)
			p.tookTurn(tp, took)
			assert.LessOrEqual(t, joined.Add(p.turn), took)
		}
		assert.Equal(t, took.Sub(joined), p.turn, "the aim reaches when it took the key")
	})
	t.Run("the hold it pulls towards is the last", func(t *testing.T) {
		p := pacing{turn: 30 * time.Millisecond}
		p.planTurn(joined, k, 20*time.Millisecond, &cfg)
		tp := p.planTurn(joined, k, 28*time.Millisecond, &cfg)
		assert.Equal(t, 28*time.Millisecond, p.busy)
		p.tookTurn(tp, tp.next)
		assert.Equal(t, 29*time.Millisecond, p.turn, "half way down to the last hold")
	})
	t.Run("a head's plan: an attempt the maximum backoff brought forward is no miss; retries double", func(t *testing.T) {
		var p pacing
		p.sawToken(1, joined)
		p.sawToken(2, joined.Add(310*time.Millisecond)) // a hand-over period of 310 ms
		last := sighting{sent: joined.Add(310 * time.Millisecond), token: 2}
		tp := p.planHead(last, sighting{sent: last.sent.Add(2 * time.Millisecond), token: 3}, anchor{}, &cfg)
		require.True(t, tp.on)
		assert.Equal(t, last.sent.Add(time.Millisecond+310*time.Millisecond), tp.next, "the midpoint plus a period")
		next, retry := tp.next, tp.retry
		early := next.Add(-50 * time.Millisecond)
		tp.miss(early, early.Add(time.Millisecond))
		assert.Equal(t, next, tp.next)
		assert.Zero(t, tp.failed)
		tp.miss(next, next.Add(time.Millisecond))
		assert.Equal(t, 1, tp.failed)
		assert.Equal(t, next.Add(time.Millisecond+retry), tp.next)
		next = tp.next
		tp.miss(next, next.Add(time.Millisecond))
		assert.Equal(t, next.Add(time.Millisecond+2*retry), tp.next, "the second retry, twice as long after")
	})
	t.Run("a head's plan: only for the one hold that began since it last looked, seen closely", func(t *testing.T) {
		var p pacing
		p.sawToken(1, joined)
		p.sawToken(2, joined.Add(300*time.Millisecond))
		last := sighting{sent: joined.Add(300 * time.Millisecond), token: 2}
		assert.True(t, p.planHead(last, sighting{sent: last.sent.Add(75 * time.Millisecond), token: 3}, anchor{}, &cfg).on, "a quarter of a period apart")
		assert.False(t, p.planHead(last, sighting{sent: last.sent.Add(76 * time.Millisecond), token: 3}, anchor{}, &cfg).on, "more than a quarter of a period apart")
		assert.False(t, p.planHead(sighting{}, sighting{sent: last.sent, token: 3}, anchor{}, &cfg).on, "nothing seen before")
		assert.False(t, p.planHead(last, sighting{sent: last.sent.Add(time.Millisecond), token: 2}, anchor{}, &cfg).on, "the same counter")
		assert.False(t, p.planHead(last, sighting{sent: last.sent.Add(time.Millisecond), token: 4}, anchor{}, &cfg).on, "two holds, or a spare")
		assert.False(t, (&pacing{}).planHead(last, sighting{sent: last.sent.Add(time.Millisecond), token: 3}, anchor{}, &cfg).on, "no period known")
	})
	t.Run("a head's plan: dated by the record's stamp, however far apart the replies", func(t *testing.T) {
		var p pacing
		p.sawToken(1, joined)
		p.sawToken(2, joined.Add(300*time.Millisecond))
		at := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC) // the server's clock: another machine's
		an := anchor{server: at, local: joined.Add(300 * time.Millisecond)}
		last := sighting{sent: an.local.Add(-time.Millisecond), token: 2, r: record{Rev: 10, Token: 2, At: at}}
		now := sighting{sent: last.sent.Add(200 * time.Millisecond), token: 3, r: record{Rev: 11, Token: 3, Owner: "y", At: at.Add(120 * time.Millisecond)}}
		tp := p.planHead(last, now, an, &cfg)
		require.True(t, tp.on, "two thirds of a period apart, but dated")
		assert.Equal(t, an.local.Add(120*time.Millisecond), tp.joined, "the stamps' difference after the anchor")
		assert.Equal(t, tp.joined.Add(300*time.Millisecond), tp.next)
		assert.False(t, p.planHead(last, now, anchor{}, &cfg).on, "no anchor: the window rule")
	})
	t.Run("a head's plan: by its own hold when that is shorter, and at least a third of the period", func(t *testing.T) {
		p := pacing{hold: 290 * time.Millisecond, rtt: 5 * time.Millisecond}
		p.sawToken(1, joined)
		p.sawToken(2, joined.Add(600*time.Millisecond)) // the start's idle time counted in
		last := sighting{sent: joined.Add(600 * time.Millisecond), token: 2}
		now := sighting{sent: last.sent.Add(2 * time.Millisecond), token: 3}
		tp := p.planHead(last, now, anchor{}, &cfg)
		require.True(t, tp.on)
		assert.Equal(t, last.sent.Add(time.Millisecond+300*time.Millisecond), tp.next, "its hold, and the two writes' round trips")
		p.hold = 180 * time.Millisecond // with the round trips, 190 ms: under a third of the period
		assert.Equal(t, last.sent.Add(time.Millisecond+600*time.Millisecond), p.planHead(last, now, anchor{}, &cfg).next, "the period")
		p.hold = 900 * time.Millisecond // longer than the period
		assert.Equal(t, last.sent.Add(time.Millisecond+600*time.Millisecond), p.planHead(last, now, anchor{}, &cfg).next, "the period")
	})
	t.Run("retries end the plan", func(t *testing.T) {
		p := pacing{turn: 10 * time.Millisecond}
		tp := plan(&p)
		for range turnRetries {
			require.True(t, tp.on)
			tp.miss(tp.next, tp.next)
		}
		assert.False(t, tp.on)
	})
}

// TestHeldSince: the record a read returns dates the hold it shows begun
// when the reply before showed the key free and the hold's acquire was
// the only write since, by the server's stamps, mapped to the Client's
// clock through a write of the wait's own; any other write since, a key
// held before, or stamps that disagree with the sends, and it does not.
func TestHeldSince(t *testing.T) {
	local := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	server := local.Add(-3 * time.Hour) // another machine's clock: only differences on it count
	an := anchor{server: server, local: local}
	hy, hx := holdKey("y", 7), holdKey("x", 9)
	waiters := func(ws ...string) map[string]entry {
		m := map[string]entry{}
		for _, hk := range ws {
			m[hk] = entry{Q: int64(len(hk)), Epoch: 1, Stored: "s" + hk}
		}
		return m
	}
	// x registered behind y, which is owed the free key; y then took it.
	last := sighting{sent: local.Add(-time.Millisecond), token: 2, r: record{Rev: 10, Token: 2, Queue: 130, At: server, Waiters: waiters(hy, hx)}}
	now := sighting{sent: local.Add(400 * time.Millisecond), token: 3, r: record{Rev: 11, Token: 3, Owner: "y", Hold: 7, Queue: 130, At: server.Add(150 * time.Millisecond), Waiters: waiters(hx)}}
	began, ok := heldSince(last, now, an)
	require.True(t, ok)
	assert.Equal(t, local.Add(150*time.Millisecond), began)

	for _, tc := range []struct {
		name   string
		change func(last, now *sighting, an *anchor)
	}{
		{"no anchor", func(_, _ *sighting, an *anchor) { *an = anchor{} }},
		{"no record before (an Unlock's freeing write)", func(last, _ *sighting, _ *anchor) { last.r = record{} }},
		{"the counter moved by two", func(_, now *sighting, _ *anchor) { now.token, now.r.Token = 4, 4 }},
		{"not held", func(_, now *sighting, _ *anchor) { now.r.Owner = "" }},
		{"an extension since", func(_, now *sighting, _ *anchor) { now.r.Rev++ }},
		{"a registration since", func(_, now *sighting, _ *anchor) {
			now.r.Queue = 195
			now.r.Waiters = waiters(hx, holdKey("z", 1))
		}},
		{"a waiter's registration extended (the in-memory store's epoch)", func(_, now *sighting, _ *anchor) {
			e := now.r.Waiters[hx]
			e.Epoch = 2
			now.r.Waiters[hx] = e
		}},
		{"a waiter's registration extended (MongoDB's stored value)", func(_, now *sighting, _ *anchor) {
			e := now.r.Waiters[hx]
			e.Stored = "extended"
			now.r.Waiters[hx] = e
		}},
		{"a waiter more, with the counter as it was", func(_, now *sighting, _ *anchor) {
			now.r.Waiters[holdKey("z", 1)] = entry{Q: 1}
		}},
		{"the acquirer's registration still there", func(_, now *sighting, _ *anchor) {
			now.r.Waiters[hy] = last.r.Waiters[hy]
		}},
		{"a waiter other than the acquirer gone", func(last, now *sighting, _ *anchor) {
			last.r.Waiters = waiters(hy, hx, holdKey("z", 1))
		}},
		{"a stamp before the anchor's", func(_, now *sighting, _ *anchor) { now.r.At = server.Add(-time.Millisecond) }},
		{"a stamp after the read was sent", func(_, now *sighting, _ *anchor) { now.r.At = server.Add(time.Second) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, n, a := last, now, an
			l.r.Waiters, n.r.Waiters = maps.Clone(l.r.Waiters), maps.Clone(n.r.Waiters)
			tc.change(&l, &n, &a)
			_, ok := heldSince(l, n, a)
			assert.False(t, ok)
		})
	}
	t.Run("held before: a release and an acquire, or a takeover and an extension", func(t *testing.T) {
		for _, rev := range []int64{11, 12} {
			l, n := last, now
			l.r.Owner, n.r.Rev = "z", rev
			_, ok := heldSince(l, n, an)
			assert.False(t, ok, "revision %d", rev)
		}
	})
	t.Run("within a round trip of the sends: put within them", func(t *testing.T) {
		n := now
		n.r.At = server.Add(403 * time.Millisecond)
		began, ok := heldSince(last, n, an)
		require.True(t, ok)
		assert.Equal(t, now.sent, began)
		a := an
		a.local = local.Add(-4 * time.Millisecond) // a round trip's error, say
		n.r.At = server.Add(time.Millisecond)      // 3 ms after the anchor's local time: 2 ms before last was sent
		began, ok = heldSince(last, n, a)
		require.True(t, ok)
		assert.Equal(t, last.sent, began, "before the earlier send: at it")
	})
}

// TestTurnPlanRunsOut: a requeued wait whose turn has not come after its
// plan's attempts (the holder ahead held the key far longer than the
// turns before) reads the document at once, in the same instant as its
// last failed attempt, and then waits as other waits do, for the key may
// be free and owed to it. Before that it reads once, after its second
// attempt, to start watching the holder (Client.acquire's watches' check). (It slept half a hand-over period first:
// measured, that left the key free while 8 Clients waited, in the first
// rounds of BenchmarkFairness.) Two Clients take turns with 10 ms holds,
// too long to keep (keep.go), so every wait is a requeued one with one
// waiter ahead; then b holds the key for 200 ms once.
func TestTurnPlanRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		a, ha := memClient(t, st)
		b, _ := memClient(t, st)
		ma, mb := a.NewMutex("k"), b.NewMutex("k")
		const (
			hold   = 10 * time.Millisecond
			rounds = 12
			long   = 7 // b's turn that lasts 200 ms
		)
		type op struct {
			at   time.Time
			name string
			err  error
		}
		var (
			mu  sync.Mutex
			ops []op // guarded by mu: a's acquires and reads during b's long turn
			rec atomic.Bool
		)
		note := func(name string) hook {
			return func(_ context.Context, call func() error) error {
				err := call()
				if rec.Load() {
					mu.Lock()
					ops = append(ops, op{time.Now(), name, err})
					mu.Unlock()
				}
				return err
			}
		}
		ha.on("acquire", note("acquire"))
		ha.on("read", note("read"))
		ringRoundsWork(t, []*Mutex{ma, mb}, rounds, func(i, r int) {
			if i == 1 && r == long {
				rec.Store(true)
				time.Sleep(200 * time.Millisecond)
				rec.Store(false)
				return
			}
			time.Sleep(hold)
		}, 0)

		mu.Lock()
		defer mu.Unlock()
		misses, reads := 0, 0
		for i, o := range ops {
			if o.name == "read" {
				reads++
				if misses == turnRetries {
					assert.Equal(t, ops[i-1].at, o.at, "the read came %v after the plan's last attempt", o.at.Sub(ops[i-1].at))
					assert.LessOrEqual(t, reads, 2, "reads during the plan besides the one that starts the watch on b's hold: %v", ops[:i+1])
					return
				}
				continue
			}
			require.ErrorIs(t, o.err, errHeld, "op %d of b's long turn: %v", i, ops)
			misses++
		}
		t.Fatalf("no read as the plan ran out: %v", ops)
	})
}

// TestHeadPlan: a Lock at the head of the queue that saw the hold it waits
// for begin (the key's token counter one more than it last saw, here when
// its Mutex's Unlock freed the key) sends its first attempt about a hold
// after that, not polling through the hold (pacer.go, planHead). x holds
// the key for a second; y waits for it, polling a millisecond or so apart
// (WithBackoff), so it takes the key within a couple of milliseconds of
// x's Unlock; x's next Lock, sent once y holds the key, registers and sees
// y's hold in the reply. With the plan, x's Lock sends at most three
// acquire attempts: the one before it registers, the first of the plan
// (within a few milliseconds of the hold's end), and a retry. Without it
// (backoffPacer), x polls through y's hold, on a backoff that starts
// from the minimum: a dozen or more. With a maximum backoff of 100 ms, the
// plan sleeps no longer than that at a time (WithBackoff): an attempt
// about every 100 ms.
func TestHeadPlan(t *testing.T) {
	const hold = time.Second
	for _, tc := range []struct {
		name    string
		opts    []Option
		most    int           // attempts, at most; 0: more than 3 (no plan)
		longest time.Duration // between two of x's commands, at most
	}{
		{"plan", []Option{WithBackoff(time.Millisecond, 2*hold)}, 3, 2 * hold},
		{"no plan", []Option{WithBackoff(time.Millisecond, 2*hold), withPacer(backoffPacer{})}, 0, 2 * hold},
		{"plan within the maximum backoff", []Option{WithBackoff(time.Millisecond, 100*time.Millisecond)}, 14, 150 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				attempts, longest := headPlanRun(t, hold, tc.opts...)
				t.Logf("x's second Lock: %d acquire attempts, at most %v apart", attempts, longest)
				if tc.most > 0 {
					assert.LessOrEqual(t, attempts, tc.most)
				} else {
					assert.Greater(t, attempts, 3, "the check has no teeth: polling sent as few attempts as the plan")
				}
				assert.LessOrEqual(t, longest, tc.longest, "x slept past its maximum backoff")
			})
		})
	}
}

// TestHeadPlanFromStamp: a Lock queued behind a waiter that is owed the
// free key and slow to come reads no more often than the age of the hold
// it last saw allows (schedule.age: an eighth of how long the counter
// stood still, here its own 4 s hold), and dates the hold it then sees
// begun by the record's stamp (heldSince): it takes the key within a few
// milliseconds of that hold's end, though its two replies were further
// apart than a plan from their midpoint allows. x holds the key 4 s; y,
// polling every 200 ms or so, registers behind it; x's Unlock frees the
// key for y, and x's next Lock registers behind y. x's read comes half a
// second later, and sees y's hold, begun up to 300 ms after x's Unlock.
// Polling on the backoff from 1 ms instead, x would read about eight
// times before it saw y's hold begin; without the stamp, its replies
// apart by more than a quarter of the 6 s period x has seen give no plan,
// and x polls through y's hold.
func TestHeadPlanFromStamp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const hold = 4 * time.Second
		st := newMemStore()
		// A TTL long enough that no registration or hold is extended in
		// the scene: an extension is a write the stamp would not date.
		ttl := WithTTL(time.Minute)
		x, hx := memClient(t, slowStore{st, time.Millisecond}, ttl, WithBackoff(time.Millisecond, 10*time.Second))
		y, _ := memClient(t, slowStore{st, time.Millisecond}, ttl, WithBackoff(200*time.Millisecond, 200*time.Millisecond))
		mx, my := x.NewMutex("k"), y.NewMutex("k")
		ctx := context.Background()
		require.NoError(t, mx.Lock(ctx))
		var yUnlocked time.Time // written before yDone closes
		yDone := make(chan struct{})
		go func() {
			defer close(yDone)
			assert.NoError(t, my.Lock(ctx))
			time.Sleep(hold)
			yUnlocked = time.Now()
			assert.NoError(t, my.Unlock(ctx))
		}()
		time.Sleep(hold)
		require.NoError(t, mx.Unlock(ctx))
		reads, acquires := hx.count("read"), hx.count("acquire")
		require.NoError(t, mx.Lock(ctx))
		locked := time.Now()
		reads, acquires = hx.count("read")-reads, hx.count("acquire")-acquires
		<-yDone
		t.Logf("x's second Lock: %d reads, %d acquire attempts, the key %v after y's Unlock began", reads, acquires, locked.Sub(yUnlocked))
		assert.LessOrEqual(t, reads, 2, "x read often behind y")
		assert.LessOrEqual(t, acquires, 2, "the one before x registered, and the plan's")
		assert.Less(t, locked.Sub(yUnlocked), 20*time.Millisecond, "x came late")
		require.NoError(t, mx.Unlock(ctx))
	})
}

// headPlanRun runs TestHeadPlan's scene, x built with xOpts, inside a
// bubble, and returns the acquire attempts of x's second Lock and the
// longest time between two of its commands.
func headPlanRun(t *testing.T, hold time.Duration, xOpts ...Option) (int, time.Duration) {
	st := newMemStore()
	x, hx := memClient(t, slowStore{st, time.Millisecond}, xOpts...)
	var (
		mu      sync.Mutex
		rec     bool          // guarded by mu: x's second Lock is under way
		last    time.Time     // guarded by mu: x's last command in it
		longest time.Duration // guarded by mu
	)
	note := func(_ context.Context, call func() error) error {
		mu.Lock()
		if rec {
			if !last.IsZero() {
				longest = max(longest, time.Since(last))
			}
			last = time.Now()
		}
		mu.Unlock()
		return call()
	}
	for _, op := range []string{"acquire", "read", "register"} {
		hx.on(op, note)
	}
	y, _ := memClient(t, slowStore{st, time.Millisecond}, WithBackoff(time.Millisecond, time.Millisecond))
	mx, my := x.NewMutex("k"), y.NewMutex("k")
	ctx := context.Background()
	require.NoError(t, mx.Lock(ctx))
	yHeld, yDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(yDone)
		assert.NoError(t, my.Lock(ctx))
		close(yHeld)
		time.Sleep(hold)
		assert.NoError(t, my.Unlock(ctx))
	}()
	time.Sleep(hold)
	require.NoError(t, mx.Unlock(ctx))
	<-yHeld
	before := hx.count("acquire")
	mu.Lock()
	rec = true
	mu.Unlock()
	require.NoError(t, mx.Lock(ctx))
	mu.Lock()
	rec = false
	mu.Unlock()
	attempts := hx.count("acquire") - before
	require.NoError(t, mx.Unlock(ctx))
	<-yDone
	mu.Lock()
	defer mu.Unlock()
	return attempts, longest
}

// A requeued wait whose plan would sleep far longer than a TTL (here its
// Mutex learnt a turn of ten TTLs) still clears a crashed waiter ahead of
// it, or takes over from a crashed holder, within the bounds of docs/fairness.md:
// no sleep of a wait is longer than maxSleep, and before its turn is due
// a wait that maxSleep woke polls as an unplanned one does. a's Unlock
// requeues its next Lock behind b's registration, and b's Client stops
// (every store call hangs, as a crashed or cut-off process's would):
// while it waits, or just after it took the key a's Unlock freed.
func TestRequeuedWaitCrashAhead(t *testing.T) {
	for _, pc := range pacers() {
		for _, tc := range []struct {
			name  string
			holds bool // b takes the key before its Client stops
		}{
			{name: "waiter ahead crashes"},
			{name: "holder crashes", holds: true},
		} {
			t.Run(pc.name+"/"+tc.name, func(t *testing.T) { requeuedCrashScene(t, tc.holds, pc.pacer) })
		}
	}
}

func requeuedCrashScene(t *testing.T, holds bool, p pacer) {
	pace := withPacer(p)
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		a, ha := memClient(t, st, pace)
		b, hb := memClient(t, st, pace)
		c, _ := memClient(t, st, pace)
		ma, mb, mc := a.NewMutex("k"), b.NewMutex("k"), c.NewMutex("k")
		ctx := context.Background()
		bctx, bcancel := context.WithCancel(ctx)
		defer bcancel()
		lockB := func() chan error {
			ch := make(chan error, 1)
			go func() { ch <- mb.Lock(bctx) }()
			synctest.Wait()
			return ch
		}
		// As requeueScene: a holds the key, and its next Unlock
		// requeues; b waits, registered.
		require.NoError(t, mc.Lock(ctx))
		aErr, bErr := lockAsync(ma), lockB()
		require.NoError(t, mc.Unlock(ctx))
		require.NoError(t, <-aErr)
		require.NoError(t, ma.Unlock(ctx))
		aErr = lockAsync(ma)
		require.NoError(t, <-bErr)
		require.NoError(t, mb.Unlock(ctx))
		bErr = lockB()
		require.NoError(t, <-aErr)
		require.Equal(t, []string{b.owner}, waiters(st, "k"))

		restart := func() {}
		crash := func() { restart = hb.stop(t) }
		if !holds {
			crash()
		}
		ma.pace.mu.Lock()
		ma.pace.turn = 10 * DefaultTTL // the plan: ten TTLs for the one waiter ahead
		ma.pace.mu.Unlock()
		time.Sleep(10 * time.Millisecond) // work: a hold too long to keep (keep.go)
		requeues, registers := ha.count("requeue"), ha.count("register")
		require.NoError(t, ma.Unlock(ctx))
		unlocked := time.Now()
		aErr = make(chan error, 1)
		go func() { aErr <- ma.Lock(ctx) }()
		last := unlocked // b's last write that a waits out
		if holds {
			require.NoError(t, <-bErr)
			last = time.Now()
			crash()
		}
		require.NoError(t, <-aErr)
		took := time.Since(last)
		t.Logf("a took the key %v after b's last write", took)
		if p.uses(ruleRequeue) { // the scene: a waits in the place its Unlock kept for it
			require.Equal(t, requeues+1, ha.count("requeue"), "a's Unlock requeued")
			require.Equal(t, registers, ha.count("register"), "a's Lock adopted the requeued registration")
		}
		ttl := registrationTTLs * DefaultTTL          // a crashed waiter ahead: its registration's TTL
		bound := ttl + fairPoll + 10*time.Millisecond // and a poll
		if holds {
			// A crashed holder: two TTLs and a poll. A plan whose first
			// attempt came late may start watching b's hold only then.
			ttl, bound = DefaultTTL, 2*DefaultTTL+fairPoll
		}
		assert.LessOrEqual(t, took, bound, "b held a up too long")
		assert.GreaterOrEqual(t, took, ttl-ttl/3, "a cleared b before it stood still for its TTL")
		assert.Equal(t, a.owner, holder(st, "k").Owner)

		restart()
		bcancel()
		if !holds {
			require.ErrorIs(t, <-bErr, context.Canceled)
		}
		require.NoError(t, ma.Unlock(ctx))
	})
}

// TestPlannedWaitCrashedHolder: a head whose plan aims late still takes
// over from a crashed holder within the bound of docs/fairness.md (two
// TTLs and a poll interval after the crash): every round of the wait
// passes the watches' check, so a planned attempt that fails on a watch
// come due is followed by a read, whatever the plan says. x's second Lock
// registers behind y's hold and plans its wait (planHead); y extends its
// hold once after that, then its Client stops. The random pacer with
// plans aims them up to a day late, as a plan built on a stale sighting
// would.
func TestPlannedWaitCrashedHolder(t *testing.T) {
	for _, pc := range pacers() {
		t.Run(pc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newMemStore()
				x, _ := memClient(t, slowStore{st, time.Millisecond}, withPacer(pc.pacer))
				y, hy := memClient(t, slowStore{st, time.Millisecond}, WithBackoff(time.Millisecond, time.Millisecond))
				mx, my := x.NewMutex("k"), y.NewMutex("k")
				ctx := context.Background()
				require.NoError(t, mx.Lock(ctx))
				yHeld := make(chan struct{})
				go func() {
					if assert.NoError(t, my.Lock(ctx)) {
						close(yHeld)
					}
				}()
				time.Sleep(time.Second)
				require.NoError(t, mx.Unlock(ctx))
				<-yHeld
				xErr := lockAsync(mx) // registers behind y's hold, and plans
				time.Sleep(DefaultTTL/3 + DefaultTTL/10)
				require.Equal(t, y.owner, holder(st, "k").Owner)
				require.Greater(t, holder(st, "k").Rev, int64(2), "y's hold was extended")
				restart := hy.stop(t) // y's Client stops
				crashed := time.Now()
				require.NoError(t, <-xErr)
				took := time.Since(crashed)
				t.Logf("x took the key %v after y's Client stopped", took)
				assert.LessOrEqual(t, took, 2*DefaultTTL+fairPoll, "the crashed holder held x up too long")
				restart()
				require.NoError(t, mx.Unlock(ctx))
			})
		})
	}
}
