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
	c, err := mongo.Connect(options.Client().ApplyURI(uri))
	require.NoError(t, err)
	db := c.Database(fmt.Sprintf("dlockstress_%d", time.Now().UnixNano()))
	t.Cleanup(func() {
		db.Drop(context.Background())
		c.Disconnect(context.Background())
	})
	return uri, db
}

// command returns this test binary, to be run as a worker process.
func command(t *testing.T, mode, uri string, db *mongo.Database, env ...string) *exec.Cmd {
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envMode+"="+mode, envURI+"="+uri, envDB+"="+db.Name())
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	return cmd
}

// TestManyProcesses: K worker processes contend for a few keys while the
// test kills some (SIGKILL, replaced by a new process) and freezes others
// past the TTL (SIGSTOP, then SIGCONT). DLOCK_STRESS_DURATION runs it
// longer than the default 20s; DLOCK_STRESS_PROCS changes K from 4.
func TestManyProcesses(t *testing.T) {
	duration := 20 * time.Second
	if d, err := time.ParseDuration(os.Getenv("DLOCK_STRESS_DURATION")); err == nil {
		duration = d
	}
	k := 4
	fmt.Sscan(os.Getenv("DLOCK_STRESS_PROCS"), &k)
	const keys = 3
	uri, db := setup(t)
	ctx := context.Background()
	for i := range keys {
		_, err := db.Collection("data").InsertOne(ctx, bson.D{{Key: "_id", Value: fmt.Sprint("key-", i)}, {Key: "value", Value: int64(0)}})
		require.NoError(t, err)
	}
	logPath := filepath.Join(t.TempDir(), "history.jsonl")
	until := time.Now().Add(duration)
	procs := map[int]*exec.Cmd{}
	exited := make(chan int, 64)
	next := 0
	spawn := func() {
		next++
		p := next
		cmd := command(t, "worker", uri, db, fmt.Sprint(envProc, "=", p), fmt.Sprint(envKeys, "=", keys),
			fmt.Sprint(envUntil, "=", until.UnixNano()), envLog+"="+logPath)
		require.NoError(t, cmd.Start())
		procs[p] = cmd
		go func() { cmd.Wait(); exited <- p }()
	}
	for range k {
		spawn()
	}

	// Faults, until a few TTLs before the end so that waiters can show progress after them.
	var kills, freezes int
	for time.Now().Before(until.Add(-3 * ttl)) {
		time.Sleep(ttl + rand.N(2*ttl)) // time between faults: the schedule, not synchronisation
		live := []int{}
		for p, cmd := range procs {
			if cmd.ProcessState == nil {
				live = append(live, p)
			}
		}
		p := live[rand.IntN(len(live))]
		if rand.IntN(2) == 0 {
			procs[p].Process.Signal(syscall.SIGKILL)
			<-exited
			delete(procs, p)
			kills++
			spawn()
		} else {
			procs[p].Process.Signal(syscall.SIGSTOP)
			time.Sleep(ttl * 3 / 2) // frozen past its lease
			procs[p].Process.Signal(syscall.SIGCONT)
			freezes++
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
	var r report
	checkExclusion(events, &r)
	checkRegisters(events, final, time.Now().UnixNano(), &r)
	t.Logf("%d processes (%d killed, %d frozen past the TTL) over %v: %d holds, %d reads, %d writes: %d admitted, %d stale rejected, %d unknown; final registers %v; %d violations",
		next, kills, freezes, duration, r.holds, r.reads, r.writes, r.accepted, r.stale, r.unknown, final, len(r.violations))
	assert.Empty(t, r.violations)
	assert.Positive(t, r.accepted)

	// Progress after the faults: admitted writes in the last stretch.
	late := 0
	calls := map[int]event{}
	for _, e := range events {
		if e.Op == opWriteCall {
			calls[e.ID] = e
		}
		if e.Op == opWriteRet && e.Res == resOK && calls[e.ID].T > until.Add(-2*ttl).UnixNano() {
			late++
		}
	}
	assert.Positive(t, late, "waiters progress once the faults stop")
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
