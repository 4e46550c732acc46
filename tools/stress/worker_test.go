package stress

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// A worker is this test binary run again as a separate process (see
// TestMain), with its own Client. Its settings come from the environment.
const (
	envMode  = "DLOCK_STRESS_MODE" // "worker" or "frozen"
	envURI   = "DLOCK_STRESS_URI"
	envDB    = "DLOCK_STRESS_DB"
	envProc  = "DLOCK_STRESS_PROC"   // process number, unique in a run
	envKeys  = "DLOCK_STRESS_KEYS"   // number of keys contended for
	envUntil = "DLOCK_STRESS_UNTIL"  // stop time, Unix nanoseconds
	envLog   = "DLOCK_STRESS_LOG"    // history file, appended to
	envNet   = "DLOCK_STRESS_NET"    // network faults to inject, comma-separated (netfaults_test.go)
	envCalm  = "DLOCK_STRESS_CALM"   // no faults from then on, Unix nanoseconds
	envShare = "DLOCK_STRESS_SHARED" // "1": lock the keys rwKey, semKey and leaderKey instead
)

// The keys of a shared run: an RWMutex's, whose writers read and write its
// register and whose readers read it; a Semaphore's of semPermits; and an
// Election's, whose leaders read and write its register.
const (
	rwKey      = "rw"
	semKey     = "sem"
	leaderKey  = "leader"
	semPermits = 2
)

const ttl = time.Second

// event is one line of a worker's history. T is the machine's wall clock,
// which every process here shares, in Unix nanoseconds.
type event struct {
	P   int    `json:"p"`             // process
	Op  string `json:"op"`            // see the op* constants
	Key string `json:"k,omitempty"`   // lock key and register
	Tok uint64 `json:"tok,omitempty"` // fencing token of the hold
	ID  int    `json:"id,omitempty"`  // pairs a call with its return
	V   int64  `json:"v,omitempty"`   // value read, or value written
	Res string `json:"res,omitempty"` // outcome of a write
	Sh  bool   `json:"sh,omitempty"`  // a shared hold: an RWMutex's read hold or a Semaphore's permit
	T   int64  `json:"t"`
}

const (
	opLockCall  = "lock-call"  // the worker calls Lock on Key; its next acquired, if any, is this call's
	opAcquired  = "acquired"   // Lock returned the hold Tok on Key
	opLost      = "lost"       // the hold's Lost channel closed (T: when the worker saw Done close)
	opRelease   = "release"    // the holder calls Unlock
	opFault     = "fault"      // a fault (Res: its kind) begins; the parent logs process faults with P the process struck, P 0 for the server
	opThawed    = "thawed"     // the parent resumed process P (SIGCONT), after a fault faultFreeze
	opValid     = "valid"      // the holder checked its lease: valid at T or later
	opReadCall  = "read-call"  // reading the register, fenced by Tok unless Sh
	opReadRet   = "read-ret"   // Res: resOK (V is the value read), resStale or resUnknown
	opWriteCall = "write-call" // writing V to the register, fenced by Tok
	opWriteRet  = "write-ret"  // Res: resOK, resStale or resUnknown
)

const (
	resOK      = "ok"
	resStale   = "stale"
	resUnknown = "unknown" // failed without a verdict: it may have applied
)

// history appends events to a file, one write(2) per line, so that a
// killed process leaves every line it finished.
type history struct {
	f    *os.File
	proc int
}

func (h *history) log(e event) {
	if e.P == 0 {
		e.P = h.proc
	}
	b, _ := json.Marshal(e)
	h.f.Write(append(b, '\n'))
}

func now() int64 { return time.Now().UnixNano() }

func connectFromEnv() (*mongo.Database, error) {
	return connect(os.Getenv(envURI))
}

func connect(uri string) (*mongo.Database, error) {
	c, err := mongo.Connect(options.Client().ApplyURI(uri).
		SetServerSelectionTimeout(5 * time.Second).SetTimeout(5 * time.Second))
	if err != nil {
		return nil, err
	}
	return c.Database(os.Getenv(envDB)), nil
}

// runWorker contends for the keys until the stop time. Inside each hold it
// reads the key's register and writes it back plus one, both fenced by the
// hold's token, recording every step. Until the calm time it injects the
// network faults it was given into some of its holds.
func runWorker() error {
	uri := os.Getenv(envURI)
	var nf *netFaults
	if kinds := os.Getenv(envNet); kinds != "" {
		var err error
		if nf, uri, err = startNetFaults(uri, strings.Split(kinds, ",")); err != nil {
			return err
		}
	}
	db, err := connect(uri)
	if err != nil {
		return err
	}
	proc, _ := strconv.Atoi(os.Getenv(envProc))
	keys, _ := strconv.Atoi(os.Getenv(envKeys))
	until, _ := strconv.ParseInt(os.Getenv(envUntil), 10, 64)
	calm, _ := strconv.ParseInt(os.Getenv(envCalm), 10, 64)
	f, err := os.OpenFile(os.Getenv(envLog), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	h := &history{f: f, proc: proc}
	c, err := dlock.NewClient(db.Collection("locks"), dlock.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	stop := prune(c, until)
	defer stop()
	data := db.Collection("data")
	shared := os.Getenv(envShare) == "1"
	seq := 0
	for now() < until {
		var key string
		var hold holder
		if !shared {
			key = fmt.Sprint("key-", rand.IntN(keys))
			hold = mutexHolder{c.NewMutex(key)}
		} else {
			switch rand.IntN(4) {
			case 0:
				key, hold = rwKey, readHolder{c.NewRWMutex(rwKey)}
			case 1:
				key, hold = rwKey, mutexHolder{c.NewRWMutex(rwKey)}
			case 2:
				key, hold = semKey, &semHolder{s: c.NewSemaphore(semKey, semPermits)}
			default:
				key, hold = leaderKey, &leaderHolder{e: c.NewElection(leaderKey), value: fmt.Sprint("process ", proc)}
			}
		}
		sh := hold.shared()
		fault := nf.pick(calm)
		if fault != "" {
			h.log(event{Op: opFault, Key: key, Res: fault, T: now()})
		}
		undo := func() {}
		if fault == faultResetAcquire {
			if undo, err = nf.resetReplies(); err != nil {
				return err
			}
			time.AfterFunc(100*time.Millisecond, undo) // the acquire's first reply is lost, a retry gets through
		}
		ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, until))
		h.log(event{Op: opLockCall, Key: key, T: now()}) // a freeze from here on may leave the hold unseen past its lease
		l, err := hold.lock(ctx)
		cancel()
		if err != nil {
			continue
		}
		tok := uint64(l.Token())
		h.log(event{Op: opAcquired, Key: key, Tok: tok, Sh: sh, T: now()})
		go func() {
			<-l.Done()
			t := now()
			// Lost closes a moment after Done: reading it here could miss
			// it. Err, a *LeaseLostError exactly when Lost is closed, waits
			// for the lease's end to finish.
			if errors.Is(l.Err(), dlock.ErrLeaseLost) {
				h.log(event{Op: opLost, Key: key, Tok: tok, T: t})
			}
		}()
		switch fault {
		case faultResetExtend: // an extension or more is applied, its reply lost
			if undo, err = nf.resetReplies(); err != nil {
				return err
			}
			time.Sleep(cadence * 3 / 2) // the fault's length, not synchronisation
			undo()
		case faultBlackhole: // cut off past the TTL: the lease must be lost
			if undo, err = nf.blackhole(); err != nil {
				return err
			}
			time.Sleep(ttl * 3 / 2)
			undo()
		case faultLatency: // slow replies for the rest of the hold, release included
			if undo, err = nf.delayReplies(cadence * 3 / 2); err != nil {
				return err
			}
		}
		valid := func() bool {
			t := now() // before the check: valid then if valid at the check
			if l.Err() != nil {
				return false
			}
			h.log(event{Op: opValid, Key: key, Tok: tok, Sh: sh, T: t})
			return true
		}
		if key == semKey { // permits protect no register: the check is how many hold at once
			if valid() {
				time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond) // the work
				valid()
			}
		} else if valid() {
			seq++
			id := proc*1_000_000 + seq
			h.log(event{Op: opReadCall, Key: key, Tok: tok, ID: id, Sh: sh, T: now()})
			v, res := read(l.Context(), data, key, l.Token(), sh)
			h.log(event{Op: opReadRet, ID: id, V: v, Res: res, T: now()})
			if res == resOK {
				time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond) // the work
				if valid() && !sh {                                         // readers only read
					seq++
					id := proc*1_000_000 + seq
					h.log(event{Op: opWriteCall, Key: key, Tok: tok, ID: id, V: v + 1, T: now()})
					res := write(data, key, v+1, l.Token())
					h.log(event{Op: opWriteRet, ID: id, Res: res, T: now()})
				}
			}
		}
		if fault == faultResetRelease { // the release applies, its reply is lost: an error, the key free
			if undo, err = nf.resetReplies(); err != nil {
				return err
			}
		}
		h.log(event{Op: opRelease, Key: key, Tok: tok, T: now()})
		hold.unlock(context.Background())
		undo()
	}
	return nil
}

// prune runs Prune with idle 0 at random moments, every 50 ms on average,
// beside the worker's Locks, until the time until or stop: the deletes of
// freed keys race other workers' Locks, and reach the server through the
// worker's faults. The checks catch a token handed out twice.
func prune(c *dlock.Client, until int64) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for now() < until {
			select {
			case <-done:
				return
			case <-time.After(time.Duration(rand.IntN(100)) * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), ttl)
			c.Prune(ctx, 0) // errors (faults, a restarted server) only end this round
			cancel()
		}
	}()
	return func() { close(done); <-stopped }
}

// A holder is how a worker takes and gives back a hold of its key.
type holder interface {
	lock(ctx context.Context) (*dlock.Lease, error)
	unlock(ctx context.Context) error
	shared() bool
}

// mutexHolder holds a Mutex's key, or an RWMutex's exclusively.
type mutexHolder struct {
	m interface {
		Lock(context.Context) error
		Unlock(context.Context) error
		Lease() *dlock.Lease
	}
}

func (m mutexHolder) lock(ctx context.Context) (*dlock.Lease, error) {
	err := m.m.Lock(ctx)
	return m.m.Lease(), err
}
func (m mutexHolder) unlock(ctx context.Context) error { return m.m.Unlock(ctx) }
func (mutexHolder) shared() bool                       { return false }

// readHolder holds an RWMutex's key shared.
type readHolder struct{ rw *dlock.RWMutex }

func (r readHolder) lock(ctx context.Context) (*dlock.Lease, error) {
	err := r.rw.RLock(ctx)
	return r.rw.Lease(), err
}
func (r readHolder) unlock(ctx context.Context) error { return r.rw.RUnlock(ctx) }
func (readHolder) shared() bool                       { return true }

// semHolder holds a Semaphore's permit.
type semHolder struct {
	s *dlock.Semaphore
	l *dlock.Lease
}

func (s *semHolder) lock(ctx context.Context) (*dlock.Lease, error) {
	var err error
	s.l, err = s.s.Acquire(ctx)
	return s.l, err
}
func (s *semHolder) unlock(ctx context.Context) error { return s.l.Release(ctx) }
func (*semHolder) shared() bool                       { return true }

// leaderHolder leads an Election for a term; resigning ends it.
type leaderHolder struct {
	e     *dlock.Election
	value string
	l     *dlock.Lease
}

func (h *leaderHolder) lock(ctx context.Context) (*dlock.Lease, error) {
	var err error
	h.l, err = h.e.Campaign(ctx, h.value)
	return h.l, err
}
func (h *leaderHolder) unlock(ctx context.Context) error { return h.l.Release(ctx) }
func (*leaderHolder) shared() bool                       { return false }

// read reads the register and says what became of the read. A writer's
// read is fenced by t ([dlock.FindFenced]): it raises the register's fence,
// so that an older holder's write, delayed past its lease, cannot land
// between this read and the write that follows it (a lost update). A
// shared holder's read is a plain one: readers do not write, and raising
// the fence to one reader's token would refuse another's older one. Unlike
// write, it runs under the lease's context: a read after the lease ended
// is cancelled (its outcome unknown: the checker allows a fenced read that
// raised the fence, or not), and the hold writes nothing after it.
func read(ctx context.Context, data *mongo.Collection, key string, t dlock.Token, shared bool) (int64, string) {
	var reg struct{ Value int64 }
	var err error
	if shared {
		err = data.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&reg)
	} else {
		var raw bson.Raw
		if raw, err = dlock.FindFenced(ctx, data, bson.D{{Key: "_id", Value: key}}, t); err == nil {
			err = bson.Unmarshal(raw, &reg)
		}
	}
	switch {
	case err == nil:
		return reg.Value, resOK
	case errors.Is(err, dlock.ErrStaleToken):
		return 0, resStale
	default:
		return 0, resUnknown
	}
}

// write sets the register to v, fenced by t, and says what became of it;
// the register records t too (by), for a failure to be studied.
// It does not use the lease's context: a write that a pause delayed past
// the lease must still reach the register, for the fence to judge it.
func write(data *mongo.Collection, key string, v int64, t dlock.Token) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := dlock.UpdateFenced(ctx, data, bson.D{{Key: "_id", Value: key}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: v}, {Key: "by", Value: int64(t)}}}}, t)
	switch {
	case err == nil:
		return resOK
	case errors.Is(err, dlock.ErrStaleToken):
		return resStale
	default:
		return resUnknown
	}
}

// runFrozen takes the key "frozen", says "held <token>" on stdout, waits for
// a line on stdin (the parent stops and resumes it meanwhile), then reports
// its lease's state and writes the register with its old token.
func runFrozen() error {
	db, err := connectFromEnv()
	if err != nil {
		return err
	}
	c, err := dlock.NewClient(db.Collection("locks"), dlock.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	mu := c.NewMutex("frozen")
	if err := mu.Lock(context.Background()); err != nil {
		return err
	}
	l := mu.Lease()
	fmt.Printf("held %d\n", l.Token())
	bufio.NewReader(os.Stdin).ReadString('\n')
	lost := errors.Is(l.Err(), dlock.ErrLeaseLost)
	res := write(db.Collection("data"), "frozen", 1000, l.Token())
	fmt.Printf("lost=%v write=%s\n", lost, res)
	return nil
}
