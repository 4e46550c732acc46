// Package dlocktest provides an in-memory lock store for testing code that
// uses dlock, with no database.
//
// A [Server] is the store; each [Server.Client] is a [*dlock.Client] on it,
// as a separate process would have one on a shared MongoDB collection:
// Clients of one Server contend for keys, hand out the same fencing tokens
// and return the same errors as they would against MongoDB, because they
// run dlock's own lease logic; only the store beneath it is replaced.
// [Server.Partition] cuts one Client off, as a network fault would, until
// [Server.Heal].
//
// # What the store does
//
// Each request a Client makes is one atomic step on one lock record, as
// MongoDB applies a single-document update; tokens and revisions never go
// back; and the store stamps each write with its own clock, time.Now. A
// partitioned Client's requests fail at once with a transient "server
// unreachable" error, and none of them is applied: its Lock keeps retrying
// until its ctx ends, its leases' extensions fail, so each lease is lost at
// its local deadline (just under the TTL after its last successful write:
// [dlock.Lease.Lost] closes, [dlock.Lease.Context] is cancelled), and
// another Client may take the key a TTL after that write.
//
// # What it does not simulate
//
// Requests take no time. A partition fails requests before they reach the
// store: it never applies a request and loses the reply, which a real
// network can do (dlock's own tests cover that case). All the Clients read
// one clock, so there is no clock drift between them. The dlock.commands
// counter of dlock's telemetry stays at zero; spans and the other metrics
// are as usual.
//
// # Fake time with testing/synctest
//
// The store starts no goroutine and reads time.Now, which inside a
// testing/synctest bubble is the bubble's fake clock; so inside a bubble a
// TTL of an hour passes in no real time, as soon as every goroutine in the
// bubble is waiting. Make the Server and its Clients inside the function
// given to synctest.Test, so that each Client's goroutines belong to the
// bubble, and Close the Clients there (a deferred Close will do): the bubble
// ends only when its goroutines have. Fake time is not free: a Lock that
// waits on another Client still polls, at most [dlock.DefaultMaxBackoff]
// apart unless [dlock.WithBackoff] says otherwise, so a wait of an hour is
// some 14,400 polls: tens of milliseconds of real time, a few hundred with
// the race detector.
// A test that a job stops when its lease is lost:
//
//	func TestJobStopsWhenLeaseLost(t *testing.T) {
//		synctest.Test(t, func(t *testing.T) {
//			ctx := context.Background()
//			srv := dlocktest.NewServer()
//			c := srv.Client(dlock.WithTTL(time.Hour))
//			defer c.Close(ctx)
//
//			m := c.NewMutex("nightly-report")
//			if err := m.Lock(ctx); err != nil {
//				t.Fatal(err)
//			}
//			lease := m.Lease()
//			stopped := make(chan struct{})
//			go func() {
//				defer close(stopped)
//				runJob(lease.Context()) // the code under test: it must return when its ctx ends
//			}()
//
//			srv.Partition(c) // every extension fails from now on
//			<-lease.Lost()   // just under an hour later, in fake time: at once in real time
//			select {
//			case <-stopped:
//			case <-time.After(time.Minute): // fake time too
//				t.Fatal("the job still runs a minute after its lease was lost")
//			}
//			srv.Heal(c)
//		})
//	}
//
// # Testing fenced writes
//
// The Server fakes the lock store, not your data: [dlock.UpsertFenced],
// [dlock.UpdateFenced] and [dlock.FindFenced] need a MongoDB collection.
// To unit-test a worker that fences its writes, put its write behind a
// small interface of your own, which production implements with those
// functions and a test with a [dlock.Fence] in front of memory: a Fence
// admits tokens by the same rule (a token lower than the highest admitted
// gets [dlock.ErrStaleToken]; token 0, [dlock.ErrInvalidOption]). Keep one
// Fence per document, as the database keeps one fence per document:
//
//	type Reports interface {
//		Save(ctx context.Context, id, text string, token dlock.Token) error
//	}
//
//	func (r *fakeReports) Save(ctx context.Context, id, text string, token dlock.Token) error {
//		r.mu.Lock()
//		defer r.mu.Unlock()
//		if err := r.fence(id).Check(token); err != nil {
//			return err
//		}
//		r.texts[id] = text
//		return nil
//	}
//
// The package's Example (FencedWrites) has the whole fake (which can also
// hold a write in flight) and runs such a test: a holder's write held up in
// the network lands after the next holder's, and the fence turns it away.
package dlocktest
