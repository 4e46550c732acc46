// Package stress runs dlock in several OS processes against the test
// server, injects process faults (SIGKILL, SIGSTOP past the TTL), and checks
// the recorded history: exclusion, fencing, no lost update, and a
// linearizable register (porcupine).
package stress

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tools/testserver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func TestMain(m *testing.M) {
	var err error
	switch os.Getenv(envMode) {
	case "":
		os.Exit(m.Run())
	case "worker":
		err = runWorker()
	case "frozen":
		err = runFrozen()
	case "server":
		err = runServer()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// setup starts a test server (or uses MONGODB_URI) and returns its URI and
// a fresh database.
func setup(t *testing.T) (string, *mongo.Database) {
	uri := os.Getenv("MONGODB_URI")
	if uri == "" {
		srv, err := testserver.Start(testserver.Config{Dir: t.TempDir()})
		require.NoError(t, err)
		t.Cleanup(func() { srv.Close() })
		uri = srv.URI()
	}
	return uri, database(t, uri)
}

// database returns a fresh database on the server at uri, dropped when the
// test ends.
func database(t *testing.T, uri string) *mongo.Database {
	c, err := mongo.Connect(options.Client().ApplyURI(uri))
	require.NoError(t, err)
	db := c.Database(fmt.Sprintf("dlockstress_%d", time.Now().UnixNano()))
	t.Cleanup(func() {
		db.Drop(context.Background())
		c.Disconnect(context.Background())
	})
	return db
}

// command returns this test binary, to be run as a worker process.
func command(t *testing.T, mode, uri string, db *mongo.Database, env ...string) *exec.Cmd {
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envMode+"="+mode, envURI+"="+uri)
	if db != nil {
		cmd.Env = append(cmd.Env, envDB+"="+db.Name())
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	return cmd
}

// A scenario is a run of worker processes under some faults.
type scenario struct {
	procs, keys int
	duration    time.Duration
	net         []string // network faults the workers inject (netfaults_test.go)
	kill        bool     // the test kills workers (SIGKILL) and starts new ones
	freeze      bool     // the test stops workers (SIGSTOP) past the TTL, then resumes them
	restart     bool     // the test kills the server process and starts it again on the same data
	shared      bool     // the workers lock an RWMutex's key and a Semaphore's (rwKey, semKey), not keys
}

// Faults the test injects, as history records them.
const (
	faultKill    = "sigkill"
	faultFreeze  = "sigstop"
	faultRestart = "server-restart"
)

// TestFaults: each fault alone, with three worker processes on two keys:
// network faults injected through toxiproxy (latency spikes past the
// extension cadence; connection resets as the replies to an acquire, to
// extensions and to a release come back; a black hole longer than the TTL
// while holding), the server process killed and restarted on the same
// data while leases are held and clients wait, a holder killed, a holder
// frozen past its TTL. Every run checks the history (see check).
func TestFaults(t *testing.T) {
	for _, sc := range []struct {
		name string
		scenario
	}{
		{faultLatency, scenario{net: []string{faultLatency}}},
		{faultResetAcquire, scenario{net: []string{faultResetAcquire}}},
		{faultResetExtend, scenario{net: []string{faultResetExtend}}},
		{faultResetRelease, scenario{net: []string{faultResetRelease}}},
		{faultBlackhole, scenario{net: []string{faultBlackhole}}},
		{faultRestart, scenario{restart: true}},
		{faultKill, scenario{kill: true}},
		{faultFreeze, scenario{freeze: true}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			sc.procs, sc.keys, sc.duration = 3, 2, 8*time.Second
			r := run(t, sc.scenario)
			assert.Positive(t, r.faults[sc.name], "faults injected")
		})
	}
}

// TestManyProcesses: K worker processes contend for a few keys while every
// fault of TestFaults strikes at random. DLOCK_STRESS_DURATION runs it
// longer than the default 20s; DLOCK_STRESS_PROCS changes K from 4.
func TestManyProcesses(t *testing.T) {
	sc := scenario{procs: 4, keys: 3, duration: 20 * time.Second, net: netFaultKinds, kill: true, freeze: true, restart: true}
	if d, err := time.ParseDuration(os.Getenv("DLOCK_STRESS_DURATION")); err == nil {
		sc.duration = d
	}
	fmt.Sscan(os.Getenv("DLOCK_STRESS_PROCS"), &sc.procs)
	r := run(t, sc)
	assert.Positive(t, len(r.faults), "faults injected")
}

// TestSharedKeys: worker processes take an RWMutex's key, shared or
// exclusively (its writers read and write its register, its readers read
// it), a Semaphore's permits, and terms as an Election's leader (which
// read and write its register), while holders are killed and frozen and
// replies are slow. Checked as TestFaults checks a Mutex's key: never two
// leaders at an instant, a leader's Lost before the next leader's term,
// fenced writes linearizable; with readers allowed to overlap each other
// and at most semPermits permits valid at an instant.
func TestSharedKeys(t *testing.T) {
	r := run(t, scenario{procs: 4, duration: 10 * time.Second, shared: true, net: []string{faultLatency, faultBlackhole}, kill: true, freeze: true})
	assert.Positive(t, r.faults[faultKill]+r.faults[faultFreeze], "faults injected")
}

// run runs a scenario, checks its history and returns the report. The
// history of a run with violations is kept (see keepHistory).
func run(t *testing.T, sc scenario) report {
	var srv *serverProc
	var uri string
	var db *mongo.Database
	if sc.restart {
		if os.Getenv("MONGODB_URI") != "" {
			t.Skip("the server is restarted only when the test runs it")
		}
		srv = startServerProc(t)
		uri = srv.uri
		db = database(t, uri)
	} else {
		uri, db = setup(t)
	}
	ctx := context.Background()
	registers := []string{rwKey, leaderKey}
	if !sc.shared {
		registers = nil
		for i := range sc.keys {
			registers = append(registers, fmt.Sprint("key-", i))
		}
	}
	for _, key := range registers {
		_, err := db.Collection("data").InsertOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "value", Value: int64(0)}})
		require.NoError(t, err)
	}
	logPath := filepath.Join(t.TempDir(), "history.jsonl")
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	require.NoError(t, err)
	defer f.Close()
	h := &history{f: f} // the test's own records: process 0
	until := time.Now().Add(sc.duration)
	calm := until.Add(-3 * ttl) // no faults from then on: waiters must make progress
	procs := map[int]*exec.Cmd{}
	exited := make(chan int, 64)
	next := 0
	spawn := func() {
		next++
		p := next
		cmd := command(t, "worker", uri, db, fmt.Sprint(envProc, "=", p), fmt.Sprint(envKeys, "=", sc.keys),
			fmt.Sprint(envUntil, "=", until.UnixNano()), fmt.Sprint(envCalm, "=", calm.UnixNano()),
			envLog+"="+logPath, envNet+"="+strings.Join(sc.net, ","), envShare+"="+map[bool]string{true: "1"}[sc.shared])
		require.NoError(t, cmd.Start())
		procs[p] = cmd
		go func() { cmd.Wait(); exited <- p }()
	}
	for range sc.procs {
		spawn()
	}

	var faults []string
	for _, on := range []struct {
		on    bool
		fault string
	}{{sc.kill, faultKill}, {sc.freeze, faultFreeze}, {sc.restart, faultRestart}} {
		if on.on {
			faults = append(faults, on.fault)
		}
	}
	// Each fault ends before calm, however long it lasts: a server still
	// down, or a holder still frozen, after calm leaves the waiters no
	// time to show progress.
	lasts := map[string]time.Duration{faultFreeze: ttl * 3 / 2, faultRestart: 2 * ttl}
	for len(faults) > 0 {
		fault := faults[rand.IntN(len(faults))]
		pause := min(ttl+rand.N(2*ttl), time.Until(calm)-lasts[fault]) // time between faults: the schedule, not synchronisation
		if pause < 0 {
			break
		}
		time.Sleep(pause)
		live := []int{}
		for p, cmd := range procs {
			if cmd.ProcessState == nil {
				live = append(live, p)
			}
		}
		p := live[rand.IntN(len(live))]
		switch fault {
		case faultKill:
			h.log(event{P: p, Op: opFault, Res: fault, T: now()})
			procs[p].Process.Signal(syscall.SIGKILL)
			<-exited
			delete(procs, p)
			spawn()
		case faultFreeze:
			h.log(event{P: p, Op: opFault, Res: fault, T: now()})
			procs[p].Process.Signal(syscall.SIGSTOP)
			time.Sleep(ttl * 3 / 2) // frozen past its lease
			procs[p].Process.Signal(syscall.SIGCONT)
			h.log(event{P: p, Op: opThawed, T: now()})
		case faultRestart:
			h.log(event{Op: opFault, Res: fault, T: now()})
			srv.kill()
			time.Sleep(rand.N(lasts[fault])) // down for up to two TTLs: some leases are lost
			srv.start()
		}
	}
	for range procs {
		p := <-exited
		assert.True(t, procs[p].ProcessState.Success(), "worker %d: %v", p, procs[p].ProcessState)
	}

	events, err := readHistory(logPath)
	require.NoError(t, err)
	final := map[string]int64{}
	cur, err := db.Collection("data").Find(ctx, bson.D{})
	require.NoError(t, err)
	var regs []struct {
		ID    string `bson:"_id"`
		Value int64  `bson:"value"`
	}
	require.NoError(t, cur.All(ctx, &regs))
	for _, r := range regs {
		final[r.ID] = r.Value
	}
	r := check(events, final, time.Now().UnixNano(), calm.UnixNano())
	t.Logf("%d processes over %v; faults %v; %d holds, %d lost, %d taken over by another process (smallest Lost-to-takeover margin %v) and %d from a frozen or killed holder; %d reads (%d stale), %d writes: %d admitted, %d stale rejected, %d unknown; %d admitted after the faults; final registers %v; %d lost updates, %d violations",
		next, sc.duration, r.faults, r.holds, r.lost, len(r.margins), r.minMargin(), r.excused, r.reads, r.staleReads, r.writes, r.accepted, r.stale, r.unknown, r.late, final, r.lostUpdates, len(r.violations))
	if !assert.Empty(t, r.violations) {
		keepHistory(t, logPath)
		for key := range final {
			t.Logf("%s's last writes: %s", key, lastWrites(events, key, 6))
		}
		rereadRegisters(t, uri, db.Name())
		if srv != nil { // fresh connections of a new server process: a stale snapshot, or the data
			srv.kill()
			srv.start()
			rereadRegisters(t, uri, db.Name())
		}
	}
	progressed := assert.Positive(t, r.accepted)
	if !assert.Positive(t, r.late, "waiters progress once the faults stop") || !progressed {
		keepHistory(t, logPath)
	}
	return r
}

// rereadRegisters logs the registers as a new client, on new connections,
// reads them: after a violation, whether the final value read was the
// data's or a stale view of it.
func rereadRegisters(t *testing.T, uri, name string) {
	c, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Logf("re-read: %v", err)
		return
	}
	defer c.Disconnect(context.Background())
	cur, err := c.Database(name).Collection("data").Find(context.Background(), bson.D{})
	if err != nil {
		t.Logf("re-read: %v", err)
		return
	}
	var regs []bson.M
	err = cur.All(context.Background(), &regs)
	t.Logf("re-read by a new client: %v (%v)", regs, err)
}

// keepHistory copies a run's history into the directory named by
// DLOCK_STRESS_KEEP, when it is set, for a failure to be studied: the
// test's own copy goes with its temporary directory.
func keepHistory(t *testing.T, path string) {
	dir := os.Getenv("DLOCK_STRESS_KEEP")
	if dir == "" {
		return
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	keep := filepath.Join(dir, fmt.Sprintf("%s-%d.jsonl", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano()))
	require.NoError(t, os.WriteFile(keep, b, 0o644))
	t.Logf("history kept in %s", keep)
}

// TestFrozenHolderIsFenced: a process frozen (SIGSTOP) past its lease
// while holding; another takes the key and writes; the frozen one resumes
// (SIGCONT), finds its lease lost, and its write with the old token is
// rejected by the fence.
func TestFrozenHolderIsFenced(t *testing.T) {
	uri, db := setup(t)
	ctx := context.Background()
	_, err := db.Collection("data").InsertOne(ctx, bson.D{{Key: "_id", Value: "frozen"}, {Key: "value", Value: int64(0)}})
	require.NoError(t, err)

	cmd := command(t, "frozen", uri, db)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	out := bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	require.NoError(t, err)
	var old int
	_, err = fmt.Sscanf(line, "held %d", &old)
	require.NoError(t, err, "frozen worker said %q", line)
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))

	// Another process's view: a Client of this test takes over and writes.
	newer := takeOver(t, db)
	assert.Greater(t, newer, old)

	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	fmt.Fprintln(stdin, "go")
	line, err = out.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "lost=true write=stale", strings.TrimSpace(line))
	require.NoError(t, cmd.Wait())

	var reg struct{ Value int64 }
	require.NoError(t, db.Collection("data").FindOne(ctx, bson.D{{Key: "_id", Value: "frozen"}}).Decode(&reg))
	assert.EqualValues(t, 1, reg.Value, "only the new holder's write landed")
}

// takeOver locks "frozen" with a Client of its own, writes 1 to the
// register with its token, and returns the token.
func takeOver(t *testing.T, db *mongo.Database) int {
	ctx := context.Background()
	c, err := dlock.NewClient(db.Collection("locks"), dlock.WithTTL(ttl))
	require.NoError(t, err)
	defer c.Close(ctx)
	mu := c.NewMutex("frozen")
	require.NoError(t, mu.Lock(ctx))
	tok := mu.Lease().Token()
	require.Equal(t, resOK, write(db.Collection("data"), "frozen", 1, tok))
	require.NoError(t, mu.Unlock(ctx))
	return int(tok)
}
