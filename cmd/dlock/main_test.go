//go:build unix

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// These tests run the dlock binary, built once in TestMain, as a user
// would, against the server at MONGODB_URI or, when it is not set, the
// embedded FerretDB of tools/mongoserver, built and started here as the
// root package's tests do.

var (
	binary  string        // the dlock binary
	testURI string        // the server
	testDB  string        // the database every test's collection is in
	mc      *mongo.Client // the tests' own connection, to hold locks as another program would
)

// watchdog bounds every wait on a dlock process: a test that reaches it
// has failed (a process that should have moved on did not).
const watchdog = 20 * time.Second

func TestMain(m *testing.M) {
	code, err := runTests(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cmd/dlock tests:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func runTests(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "dlockcli-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "dlock")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return 0, fmt.Errorf("build dlock: %w", err)
	}
	testURI = os.Getenv("MONGODB_URI")
	if testURI == "" {
		uri, stop, err := startServer(dir)
		if err != nil {
			return 0, err
		}
		defer stop()
		testURI = uri
	}
	mc, err = mongo.Connect(options.Client().ApplyURI(testURI))
	if err != nil {
		return 0, err
	}
	testDB = fmt.Sprintf("dlockcli_%d", time.Now().UnixNano())
	code := m.Run()
	mc.Database(testDB).Drop(context.Background())
	mc.Disconnect(context.Background())
	return code, nil
}

// startServer builds tools/mongoserver and runs it on a free port with its
// data under dir (a copy of the root package's startServer: test files
// are not shared between packages).
func startServer(dir string) (uri string, stop func(), err error) {
	_, here, _, _ := runtime.Caller(0)
	tools := filepath.Join(filepath.Dir(here), "..", "..", "tools")
	bin := filepath.Join(dir, "mongoserver")
	build := exec.Command("go", "build", "-o", bin, "./mongoserver")
	build.Dir, build.Stdout, build.Stderr = tools, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", nil, fmt.Errorf("build test server: %w", err)
	}
	cmd := exec.Command(bin, "-dir", filepath.Join(dir, "data"), "-exit-on-stdin-eof")
	stdin, _ := cmd.StdinPipe() // with -exit-on-stdin-eof, the server exits when this closes
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() {
		stdin.Close()
		cmd.Wait()
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "uri=") {
		stop()
		return "", nil, fmt.Errorf("test server did not start: %q %v", line, err)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, "uri=")), stop, nil
}

// collection returns a new collection name for one test.
func collection(t *testing.T) string {
	return fmt.Sprintf("%s_%d", strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()), time.Now().UnixNano())
}

// runArgs returns the arguments of "dlock run" on coll with flags, then
// KEY -- COMMAND... from rest.
func runArgs(coll string, rest ...string) []string {
	return append([]string{"run", "-uri", testURI, "-db", testDB, "-collection", coll}, rest...)
}

// A process is a dlock process started by a test. Its stdout and stderr
// come line by line on channels (closed at EOF), and its exit on exited.
type process struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout chan string
	stderr chan string
	exited chan struct{}
	err    error // set before exited closes
}

// start starts dlock with args and env added to the test's environment
// (without MONGODB_URI: each test passes -uri; nor TRACEPARENT,
// TRACESTATE and the OpenTelemetry SDK's OTEL_ variables, which a traced
// CI job may have set: tests that want them pass them). It is killed if
// still running when the test ends.
func start(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(binary, args...)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name != "MONGODB_URI" && name != "TRACEPARENT" && name != "TRACESTATE" && !strings.HasPrefix(name, "OTEL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.WaitDelay = 5 * time.Second // what COMMAND left running must not keep the pipes open
	p := &process{cmd: cmd, stdout: make(chan string, 100), stderr: make(chan string, 100), exited: make(chan struct{})}
	var err error
	p.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := func(r io.Reader, ch chan string) {
		s := bufio.NewScanner(r)
		for s.Scan() {
			ch <- s.Text()
		}
		close(ch)
	}
	read := make(chan struct{})
	go func() { lines(stdout, p.stdout); read <- struct{}{} }()
	go func() { lines(stderr, p.stderr); read <- struct{}{} }()
	go func() {
		<-read
		<-read
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		// A test that failed part way: end dlock, and its COMMAND if it
		// reads stdin, then give up on it after the watchdog (a COMMAND of
		// its own process group may outlive dlock, holding the pipes).
		p.stdin.Close()
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		select {
		case <-p.exited:
		case <-time.After(watchdog):
			t.Errorf("dlock's output still open %v after it was killed", watchdog)
		}
	})
	return p
}

// line returns the next line from ch, failing the test at the watchdog or
// at EOF.
func line(t *testing.T, ch <-chan string, what string) string {
	t.Helper()
	select {
	case l, ok := <-ch:
		if !ok {
			t.Fatalf("EOF while waiting for %s", what)
		}
		return l
	case <-time.After(watchdog):
		t.Fatalf("no %s after %v", what, watchdog)
	}
	return ""
}

// wait waits for p to exit and returns its status and the rest of its
// stdout and stderr.
func (p *process) wait(t *testing.T) (status int, stdout, stderr []string) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(watchdog):
		t.Fatalf("dlock still running after %v", watchdog)
	}
	require.False(t, errors.Is(p.err, exec.ErrWaitDelay), "COMMAND left processes holding its output")
	for l := range p.stdout {
		stdout = append(stdout, l)
	}
	for l := range p.stderr {
		stderr = append(stderr, l)
	}
	return p.cmd.ProcessState.ExitCode(), stdout, stderr
}

// dlockRun runs dlock with args to the end.
func dlockRun(t *testing.T, env []string, args ...string) (status int, stdout, stderr []string) {
	t.Helper()
	p := start(t, env, args...)
	p.stdin.Close()
	return p.wait(t)
}

// requireOneLine checks that stderr is one line, from dlock, with no
// trace of a Go panic, that contains want.
func requireOneLine(t *testing.T, stderr []string, want string) {
	t.Helper()
	require.Len(t, stderr, 1, "stderr: %q", stderr)
	assert.True(t, strings.HasPrefix(stderr[0], "dlock"), "stderr: %q", stderr[0])
	assert.NotContains(t, stderr[0], "goroutine")
	assert.NotContains(t, stderr[0], "panic")
	assert.Contains(t, stderr[0], want)
}

// newClient returns a dlock Client on coll in the test server, as another
// program sharing the locks would have.
func newClient(t *testing.T, coll string) *dlock.Client {
	t.Helper()
	c, err := dlock.NewClient(mc.Database(testDB).Collection(coll), dlock.WithTTL(time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func TestRunEnvironmentAndRelease(t *testing.T) {
	coll := collection(t)
	ctx := context.Background()
	p := start(t, nil, runArgs(coll, "-v", "nightly-report", "--",
		"sh", "-c", `echo "$DLOCK_KEY|$DLOCK_TOKEN|$DLOCK_OWNER"; read line`)...)
	f := strings.Split(line(t, p.stdout, "COMMAND's environment"), "|")
	require.Len(t, f, 3)
	assert.Equal(t, "nightly-report", f[0])
	assert.Equal(t, "1", f[1])

	// DLOCK_OWNER is the owner as stored in the lock, as Holders and dlock
	// status show it: the label host/pid, then the Client's "#" and 128
	// random bits.
	c := newClient(t, coll)
	holders, err := c.Holders(ctx, "nightly-report")
	require.NoError(t, err)
	require.Len(t, holders, 1)
	assert.Equal(t, holders[0].Owner, f[2], "DLOCK_OWNER")
	status, stdout, stderr := dlockRun(t, nil, statusArgs(coll, "nightly-report")...)
	require.Equal(t, 0, status, "stderr: %q", stderr)
	assert.Equal(t, []string{"token 1 exclusive owner " + f[2]}, stdout)
	host, err := os.Hostname()
	require.NoError(t, err)
	label := fmt.Sprintf("%s/%d", host, p.cmd.Process.Pid)
	assert.Regexp(t, "^"+regexp.QuoteMeta(label)+"#[0-9a-f]{32}$", f[2])

	fmt.Fprintln(p.stdin, "done") // COMMAND exits
	status, stdout, stderr = p.wait(t)
	require.Equal(t, 0, status, "stderr: %q", stderr)
	assert.Empty(t, stdout)
	assert.Equal(t, []string{
		`dlock run: locking "nightly-report"`,
		`dlock run: holding "nightly-report" with token 1`,
		`dlock run: released "nightly-report"`,
	}, stderr)

	// Released on exit: another program takes the key at once.
	m := c.NewMutex("nightly-report")
	require.NoError(t, m.TryLock(ctx))
	assert.Equal(t, dlock.Token(2), m.Lease().Token())
}

func TestRunExitStatus(t *testing.T) {
	coll := collection(t)
	dir := t.TempDir()
	notExecutable := filepath.Join(dir, "script")
	require.NoError(t, os.WriteFile(notExecutable, []byte("#!/bin/sh\n"), 0o644))
	for _, tc := range []struct {
		name    string
		command []string
		status  int
		stderr  string // "" for none
	}{
		{name: "success", command: []string{"true"}, status: 0},
		{name: "failure", command: []string{"sh", "-c", "exit 7"}, status: 7},
		{name: "killed by a signal", command: []string{"sh", "-c", "kill -KILL $$"}, status: 128 + 9},
		{name: "not found", command: []string{"no-such-command-dlock"}, status: exitNotFound, stderr: "executable file not found"},
		{name: "not executable", command: []string{notExecutable}, status: exitCannotRun, stderr: "permission denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, _, stderr := dlockRun(t, nil, runArgs(coll, append([]string{"k", "--"}, tc.command...)...)...)
			assert.Equal(t, tc.status, status)
			if tc.stderr == "" {
				assert.Empty(t, stderr)
			} else {
				requireOneLine(t, stderr, tc.stderr)
			}
		})
	}
	// Each run released the key.
	require.NoError(t, newClient(t, coll).NewMutex("k").TryLock(context.Background()))
}

// holder starts a dlock run on key whose COMMAND writes "NAME-start" and
// "NAME-end" to log, and between them waits for a line on its stdin (so
// the test decides when it ends). It returns once COMMAND has started.
func holder(t *testing.T, coll, key, name, log string, flags ...string) *process {
	t.Helper()
	script := fmt.Sprintf(`echo %[1]s-start >>"$LOG"; echo started; read line; echo %[1]s-end >>"$LOG"`, name)
	p := start(t, []string{"LOG=" + log}, runArgs(coll, append(flags, key, "--", "sh", "-c", script)...)...)
	require.Equal(t, "started", line(t, p.stdout, name+" started"))
	return p
}

func readLog(t *testing.T, log string) []string {
	t.Helper()
	b, err := os.ReadFile(log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	return strings.Fields(string(b))
}

// Two dlock runs on one key: the second waits for the first, and runs its
// COMMAND only after the first COMMAND ended and the key was released.
func TestRunWaitsForHolder(t *testing.T) {
	coll := collection(t)
	log := filepath.Join(t.TempDir(), "log")
	a := holder(t, coll, "k", "A", log)

	b := start(t, []string{"LOG=" + log}, runArgs(coll, "-v", "k", "--",
		"sh", "-c", `echo "B-start-$DLOCK_TOKEN" >>"$LOG"`)...)
	assert.Equal(t, `dlock run: locking "k"`, line(t, b.stderr, "B locking"))
	assert.Equal(t, `dlock run: "k" is held; waiting`, line(t, b.stderr, "B waiting"))
	assert.Equal(t, []string{"A-start"}, readLog(t, log), "B's COMMAND ran while A held the key")

	fmt.Fprintln(a.stdin, "done") // A's COMMAND ends; A releases
	status, _, stderr := a.wait(t)
	require.Equal(t, 0, status, "A: %q", stderr)
	status, _, stderr = b.wait(t)
	require.Equal(t, 0, status, "B: %q", stderr)
	assert.Equal(t, []string{"A-start", "A-end", "B-start-2"}, readLog(t, log))
}

// A -ttl shorter than the server's round trip: dlock run says from the
// start what it is waiting for, and gives up, as bad usage, instead of
// waiting silently until -timeout.
func TestRunTTLTooShort(t *testing.T) {
	coll := collection(t)
	probe, err := dlock.NewClient(mc.Database(testDB).Collection(coll), dlock.WithTTL(time.Millisecond))
	require.NoError(t, err)
	defer probe.Close(context.Background())
	if probe.NewMutex("probe").TryLock(context.Background()) == nil {
		t.Skip("this server answers an acquire within a TTL of 1 ms")
	}
	ran := filepath.Join(t.TempDir(), "ran")
	p := start(t, nil, runArgs(coll, "-v", "-ttl", "1ms", "-timeout", "15s", "k", "--", "touch", ran)...)
	p.stdin.Close()
	assert.Equal(t, `dlock run: locking "k"`, line(t, p.stderr, "the first line"))
	status, _, stderr := p.wait(t)
	assert.Equal(t, exitUsage, status)
	requireOneLine(t, stderr, "TTL too short for this server's round trip")
	assert.Contains(t, stderr[0], "-ttl")
	assert.NoFileExists(t, ran, "COMMAND ran")
}

func TestRunTryAndTimeout(t *testing.T) {
	coll := collection(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	a := holder(t, coll, "k", "A", log)
	ran := filepath.Join(dir, "ran")

	status, stdout, stderr := dlockRun(t, nil, runArgs(coll, "-try", "k", "--", "touch", ran)...)
	assert.Equal(t, exitHeld, status)
	assert.Empty(t, stdout)
	requireOneLine(t, stderr, `"k" is held by another owner (-try)`)

	begin := time.Now()
	status, _, stderr = dlockRun(t, nil, runArgs(coll, "-timeout", "300ms", "k", "--", "touch", ran)...)
	assert.Equal(t, exitHeld, status)
	requireOneLine(t, stderr, `"k" not acquired within -timeout 300ms: lock "k": context deadline exceeded (last seen held by `)
	assert.GreaterOrEqual(t, time.Since(begin), 300*time.Millisecond)

	assert.NoFileExists(t, ran, "COMMAND ran while the key was held")
	a.stdin.Close()
	status, _, _ = a.wait(t)
	assert.Equal(t, 0, status)
}

// When the lease is lost, COMMAND is stopped: with SIGTERM when it heeds
// it, with SIGKILL after -grace when it does not; dlock exits 124.
func TestRunLostLeaseStopsCommand(t *testing.T) {
	t.Run("frozen, then taken over", func(t *testing.T) {
		coll := collection(t)
		log := filepath.Join(t.TempDir(), "log")
		script := `trap 'echo TERM >>"$LOG"; kill $! 2>/dev/null; exit 3' TERM; echo started; sleep 60 & wait`
		p := start(t, []string{"LOG=" + log}, runArgs(coll, "-ttl", "1s", "-grace", "5s", "k", "--", "sh", "-c", script)...)
		require.Equal(t, "started", line(t, p.stdout, "COMMAND started"))

		// Freeze dlock; another program takes the key once its lease has
		// lapsed (a TTL of watching it unchanged), then dlock resumes.
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGSTOP))
		m := newClient(t, coll).NewMutex("k")
		ctx, cancel := context.WithTimeout(context.Background(), watchdog)
		defer cancel()
		require.NoError(t, m.Lock(ctx))
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGCONT))

		status, _, stderr := p.wait(t)
		assert.Equal(t, exitLost, status)
		require.NotEmpty(t, stderr)
		assert.Contains(t, stderr[0], `dlock run: lease on "k" (token 1) lost`)
		assert.Contains(t, stderr[0], "stopping COMMAND (SIGTERM, SIGKILL after 5s)")
		assert.Equal(t, []string{"TERM"}, readLog(t, log), "COMMAND did not get SIGTERM")
		require.NotNil(t, m.Lease(), "dlock's exit freed the new holder's key")
	})

	t.Run("TERM ignored, at -max-hold", func(t *testing.T) {
		coll := collection(t)
		begin := time.Now()
		p := start(t, nil, runArgs(coll, "-ttl", "1s", "-max-hold", "1s", "-grace", "300ms", "k", "--",
			"sh", "-c", `trap '' TERM; echo started; sleep 60`)...)
		require.Equal(t, "started", line(t, p.stdout, "COMMAND started"))
		status, _, stderr := p.wait(t) // fails if the sleep survived, holding the output open
		took := time.Since(begin)
		assert.Equal(t, exitLost, status)
		require.Len(t, stderr, 2, "stderr: %q", stderr)
		assert.Contains(t, stderr[0], "maximum hold time reached")
		assert.Contains(t, stderr[1], "COMMAND still running 300ms after SIGTERM; sending SIGKILL")
		assert.Greater(t, took, 1270*time.Millisecond, "killed before the cap (0.97 s for a TTL of 1 s) and -grace")
	})
}

func TestRunForwardsSignals(t *testing.T) {
	coll := collection(t)
	log := filepath.Join(t.TempDir(), "log")
	script := `trap 'echo INT >>"$LOG"; kill $! 2>/dev/null; exit 5' INT; echo started; sleep 60 & wait`
	p := start(t, []string{"LOG=" + log}, runArgs(coll, "k", "--", "sh", "-c", script)...)
	require.Equal(t, "started", line(t, p.stdout, "COMMAND started"))
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	status, _, stderr := p.wait(t)
	assert.Equal(t, 5, status, "stderr: %q", stderr)
	assert.Equal(t, []string{"INT"}, readLog(t, log))

	// A signal while waiting for the key ends the wait.
	a := holder(t, coll, "k", "A", log)
	b := start(t, nil, runArgs(coll, "-v", "k", "--", "true")...)
	line(t, b.stderr, "B locking")
	line(t, b.stderr, "B waiting")
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGTERM))
	status, _, stderr = b.wait(t)
	assert.Equal(t, 128+int(syscall.SIGTERM), status)
	requireOneLine(t, stderr, `dlock run: terminated while waiting for "k"`)
	a.stdin.Close()
	a.wait(t)
}

func TestRunUnreachableServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().String()
	l.Close()
	begin := time.Now()
	status, _, stderr := dlockRun(t, nil, "run", "-uri", "mongodb://"+closed+"/", "-connect-timeout", "500ms", "k", "--", "true")
	assert.Equal(t, exitUnavailable, status)
	requireOneLine(t, stderr, "dlock run: could not reach the server")
	assert.Less(t, time.Since(begin), 5*time.Second)

	status, _, stderr = dlockRun(t, nil, "run", "k", "--", "true") // no -uri, no MONGODB_URI
	assert.Equal(t, exitUsage, status)
	requireOneLine(t, stderr, "no server: set -uri or MONGODB_URI")
}

func TestUsage(t *testing.T) {
	coll := collection(t)
	for _, tc := range []struct {
		name   string
		args   []string
		status int
		stderr string // the one line expected on stderr; "" for none
	}{
		{name: "unknown subcommand", args: []string{"frob"}, status: exitUsage, stderr: `dlock: unknown subcommand "frob"`},
		{name: "flag before the subcommand", args: []string{"-ttl", "1s", "run"}, status: exitUsage, stderr: "flags go after the subcommand"},
		{name: "bad flag", args: runArgs(coll, "-nope", "k", "--", "true"), status: exitUsage,
			stderr: "dlock run: flag provided but not defined: -nope (dlock run -h for help)"},
		{name: "bad duration", args: runArgs(coll, "-ttl", "soon", "k", "--", "true"), status: exitUsage,
			stderr: `invalid value "soon" for flag -ttl`},
		{name: "no --", args: runArgs(coll, "k", "true"), status: exitUsage, stderr: "want KEY -- COMMAND"},
		{name: "flag after KEY", args: runArgs(coll, "k", "-try", "--", "true"), status: exitUsage, stderr: "with the flags before KEY"},
		{name: "no COMMAND", args: runArgs(coll, "k", "--"), status: exitUsage, stderr: "want KEY -- COMMAND"},
		{name: "no KEY", args: runArgs(coll), status: exitUsage, stderr: "missing KEY"},
		{name: "negative grace", args: runArgs(coll, "-grace", "-1s", "k", "--", "true"), status: exitUsage, stderr: "-grace -1s is negative"},
		{name: "max hold under the TTL", args: runArgs(coll, "-ttl", "10s", "-max-hold", "1s", "k", "--", "true"), status: exitUsage,
			stderr: "maximum hold 1s is shorter than the TTL 10s"},
		{name: "invalid key", args: runArgs(coll, "", "--", "true"), status: exitUsage, stderr: "invalid key: empty"},
		{name: "bad URI", args: []string{"run", "-uri", "http://x", "k", "--", "true"}, status: exitUsage, stderr: "dlock run: -uri:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, stdout, stderr := dlockRun(t, nil, tc.args...)
			assert.Equal(t, tc.status, status)
			assert.Empty(t, stdout)
			requireOneLine(t, stderr, tc.stderr)
		})
	}

	t.Run("no arguments", func(t *testing.T) {
		status, _, stderr := dlockRun(t, nil)
		assert.Equal(t, exitUsage, status)
		assert.Contains(t, strings.Join(stderr, "\n"), "dlock run [flags] KEY [KEY...] -- COMMAND")
	})
	for _, args := range [][]string{{"-h"}, {"help"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			status, stdout, stderr := dlockRun(t, nil, args...)
			assert.Equal(t, 0, status)
			assert.Empty(t, stderr)
			assert.Contains(t, strings.Join(stdout, "\n"), "  run      run COMMAND while holding the lock KEY")
		})
	}
	for _, args := range [][]string{{"run", "-h"}, {"help", "run"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			status, stdout, stderr := dlockRun(t, nil, args...)
			assert.Equal(t, 0, status)
			assert.Empty(t, stderr)
			help := strings.Join(stdout, "\n")
			for _, flag := range []string{"uri", "db", "collection", "connect-timeout", "ttl", "try", "timeout", "grace", "max-hold", "v"} {
				assert.Regexp(t, `(?m)^  -`+flag+`\b`, help, "flag -%s not explained", flag)
			}
			assert.Contains(t, help, "124 the lease was lost")
		})
	}
}

// electArgs returns the arguments of "dlock elect" on coll with rest.
func electArgs(coll string, rest ...string) []string {
	return append([]string{"elect", "-uri", testURI, "-db", testDB, "-collection", coll}, rest...)
}

// statusArgs returns the arguments of "dlock status" on coll with rest.
func statusArgs(coll string, rest ...string) []string {
	return append([]string{"status", "-uri", testURI, "-db", testDB, "-collection", coll}, rest...)
}

func TestStatus(t *testing.T) {
	coll := collection(t)
	status, stdout, stderr := dlockRun(t, nil, statusArgs(coll, "k")...)
	require.Equal(t, 0, status, "stderr: %q", stderr)
	assert.Equal(t, []string{`"k" is free`}, stdout)
	status, stdout, _ = dlockRun(t, nil, statusArgs(coll, "-json", "k")...)
	require.Equal(t, 0, status)
	assert.JSONEq(t, `{"key": "k", "free": true, "holders": []}`, strings.Join(stdout, "\n"))

	c, err := dlock.NewClient(mc.Database(testDB).Collection(coll), dlock.WithData([]byte("report #1")))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })
	m := c.NewMutex("k")
	require.NoError(t, m.Lock(context.Background()))
	status, stdout, stderr = dlockRun(t, nil, statusArgs(coll, "k")...)
	require.Equal(t, 0, status, "stderr: %q", stderr)
	assert.Equal(t, []string{fmt.Sprintf(`token 1 exclusive owner %s data "report #1"`, c.Owner())}, stdout)
	status, stdout, _ = dlockRun(t, nil, statusArgs(coll, "-json", "k")...)
	require.Equal(t, 0, status)
	assert.JSONEq(t, fmt.Sprintf(`{"key": "k", "free": false, "holders": [{"owner": %q, "token": 1, "shared": false, "data": "report #1"}]}`, c.Owner()),
		strings.Join(stdout, "\n"))

	// A waiter registered behind the hold: a line of its own.
	waiter := newClient(t, coll)
	wctx, wcancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { waited <- waiter.NewMutex("k").Lock(wctx) }()
	for {
		hs, err := c.Holders(context.Background(), "k")
		require.NoError(t, err)
		if len(hs) == 2 {
			break
		}
	}
	status, stdout, _ = dlockRun(t, nil, statusArgs(coll, "k")...)
	require.Equal(t, 0, status)
	assert.Equal(t, fmt.Sprintf("waiting owner %s", waiter.Owner()), stdout[len(stdout)-1])
	wcancel()
	require.ErrorIs(t, <-waited, context.Canceled)

	// Shared holds, without data.
	other := newClient(t, coll)
	s := other.NewSemaphore("s", 2)
	for range 2 {
		_, err := s.Acquire(context.Background())
		require.NoError(t, err)
	}
	status, stdout, _ = dlockRun(t, nil, statusArgs(coll, "s")...)
	require.Equal(t, 0, status)
	assert.Equal(t, []string{
		fmt.Sprintf("token 1 shared owner %s", other.Owner()),
		fmt.Sprintf("token 2 shared owner %s", other.Owner()),
	}, stdout)

	status, _, stderr = dlockRun(t, nil, statusArgs(coll, "a", "b")...)
	assert.Equal(t, exitUsage, status)
	requireOneLine(t, stderr, "dlock status: want one KEY")
}

// A hold taken under a traced context: status names the trace, text and
// JSON, so that an operator can find what the holder is doing.
func TestStatusTrace(t *testing.T) {
	coll := collection(t)
	spans := tracetest.NewSpanRecorder()
	c, err := dlock.NewClient(mc.Database(testDB).Collection(coll),
		dlock.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })
	require.NoError(t, c.NewMutex("k").Lock(context.Background()))
	require.Len(t, spans.Ended(), 1)
	lock := spans.Ended()[0].SpanContext()

	status, stdout, stderr := dlockRun(t, nil, statusArgs(coll, "k")...)
	require.Equal(t, 0, status, "stderr: %q", stderr)
	assert.Equal(t, []string{fmt.Sprintf("token 1 exclusive owner %s trace %s", c.Owner(), lock.TraceID())}, stdout)
	status, stdout, _ = dlockRun(t, nil, statusArgs(coll, "-json", "k")...)
	require.Equal(t, 0, status)
	assert.JSONEq(t, fmt.Sprintf(`{"key": "k", "free": false, "holders": [{"owner": %q, "token": 1, "shared": false, "trace_id": %q, "span_id": %q}]}`,
		c.Owner(), lock.TraceID(), lock.SpanID()), strings.Join(stdout, "\n"))
}

// A run in a traced CI job (TRACEPARENT, and TRACESTATE, set by the CI
// system or otel-cli): the hold stores the job's trace context, which
// dlock status shows, and COMMAND gets it in its environment, so that its
// steps stay in the job's trace. A TRACEPARENT that is not valid costs a
// warning and the trace, never the run, and COMMAND's environment is left
// as it was.
func TestRunTraceParent(t *testing.T) {
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
		parent  = "00-" + traceID + "-" + spanID + "-01"
	)
	coll := collection(t)
	for _, tc := range []struct {
		name        string
		parent      string // TRACEPARENT
		state       string // TRACESTATE; "" for unset
		wantTrace   bool   // the hold stores traceID and spanID, and no warning
		childParent string // COMMAND's TRACEPARENT
		childState  string // COMMAND's TRACESTATE
	}{
		{name: "sampled, with tracestate", parent: parent, state: "vendor=opaque", wantTrace: true,
			childParent: parent, childState: "vendor=opaque"},
		{name: "not sampled", parent: "00-" + traceID + "-" + spanID + "-00", wantTrace: true,
			childParent: "00-" + traceID + "-" + spanID + "-00"},
		{name: "a later version, read as version 00", parent: "01-" + traceID + "-" + spanID + "-01-later", wantTrace: true,
			childParent: parent},
		{name: "tracestate that does not parse", parent: parent, state: "=no-key", wantTrace: true,
			childParent: parent},
		{name: "not a traceparent", parent: "job-42", state: "vendor=opaque",
			childParent: "job-42", childState: "vendor=opaque"},
		{name: "upper-case hex", parent: strings.ToUpper(parent),
			childParent: strings.ToUpper(parent)},
		{name: "zero trace id", parent: "00-00000000000000000000000000000000-" + spanID + "-01",
			childParent: "00-00000000000000000000000000000000-" + spanID + "-01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := []string{"TRACEPARENT=" + tc.parent}
			if tc.state != "" {
				env = append(env, "TRACESTATE="+tc.state)
			}
			// COMMAND prints its trace context, then runs dlock status on
			// the key it holds.
			status, stdout, stderr := dlockRun(t, env, runArgs(coll, "k", "--", "sh", "-c", `echo "$TRACEPARENT|$TRACESTATE"; exec "$@"`,
				"sh", binary, "status", "-uri", testURI, "-db", testDB, "-collection", coll, "-json", "k")...)
			require.Equal(t, 0, status, "stderr: %q", stderr)
			if tc.wantTrace {
				assert.Empty(t, stderr)
			} else {
				requireOneLine(t, stderr, fmt.Sprintf("dlock run: ignoring TRACEPARENT %q: not a W3C traceparent", tc.parent))
			}
			require.NotEmpty(t, stdout)
			assert.Equal(t, tc.childParent+"|"+tc.childState, stdout[0], "COMMAND's TRACEPARENT|TRACESTATE")
			var report statusReport
			require.NoError(t, json.Unmarshal([]byte(strings.Join(stdout[1:], "\n")), &report))
			require.Len(t, report.Holders, 1)
			h := report.Holders[0]
			if tc.wantTrace {
				assert.Equal(t, traceID, h.TraceID, "the hold's trace")
				assert.Equal(t, spanID, h.SpanID, "the hold's parent span")
			} else {
				assert.Empty(t, h.TraceID+h.SpanID, "the hold's trace")
			}
		})
	}

	t.Run("elect", func(t *testing.T) {
		status, stdout, stderr := dlockRun(t, []string{"TRACEPARENT=" + parent}, electArgs(coll, "leader", "db1:5432", "--", "sh", "-c",
			`echo "$TRACEPARENT"; exec "$@"`, "sh", binary, "status", "-uri", testURI, "-db", testDB, "-collection", coll, "leader")...)
		require.Equal(t, 0, status, "stderr: %q", stderr)
		require.Len(t, stdout, 2)
		assert.Equal(t, parent, stdout[0])
		assert.Regexp(t, `^token 1 exclusive owner \S+ data "db1:5432" trace `+traceID+`$`, stdout[1])
	})
}

// Two dlock elect processes on one name: the second runs its COMMAND
// only after the first's COMMAND ended and it resigned; while the first
// leads, dlock status shows its value.
func TestElectTakesTurns(t *testing.T) {
	coll := collection(t)
	log := filepath.Join(t.TempDir(), "log")
	script := func(name string) string {
		return fmt.Sprintf(`echo %[1]s-start-$DLOCK_TOKEN >>"$LOG"; echo started; read line; echo %[1]s-end >>"$LOG"`, name)
	}
	a := start(t, []string{"LOG=" + log}, electArgs(coll, "-v", "leader", "db1:5432", "--", "sh", "-c", script("A"))...)
	require.Equal(t, "started", line(t, a.stdout, "A started"))
	assert.Equal(t, `dlock elect: campaigning for "leader"`, line(t, a.stderr, "A campaigning"))
	assert.Equal(t, `dlock elect: leading "leader" with token 1`, line(t, a.stderr, "A leading"))

	b := start(t, []string{"LOG=" + log}, electArgs(coll, "-v", "leader", "db2:5432", "--", "sh", "-c", script("B"))...)
	assert.Equal(t, `dlock elect: campaigning for "leader"`, line(t, b.stderr, "B campaigning"))
	status, stdout, _ := dlockRun(t, nil, statusArgs(coll, "leader")...)
	require.Equal(t, 0, status)
	require.NotEmpty(t, stdout)
	for _, l := range stdout[1:] { // B may be registered behind A already
		assert.True(t, strings.HasPrefix(l, "waiting owner "), "status line %q", l)
	}
	assert.Contains(t, stdout[0], `token 1 exclusive owner `)
	assert.Contains(t, stdout[0], `data "db1:5432"`)
	assert.Equal(t, []string{"A-start-1"}, readLog(t, log), "B's COMMAND ran while A led")

	fmt.Fprintln(a.stdin, "done") // A's COMMAND ends; A resigns
	status, _, stderr := a.wait(t)
	require.Equal(t, 0, status, "A: %q", stderr)
	require.Equal(t, "started", line(t, b.stdout, "B started"))
	fmt.Fprintln(b.stdin, "done")
	status, _, stderr = b.wait(t)
	require.Equal(t, 0, status, "B: %q", stderr)
	assert.Equal(t, []string{"A-start-1", "A-end", "B-start-2", "B-end"}, readLog(t, log))
}

// Every signal that asks a process to end, or means something to COMMAND
// alone, reaches COMMAND's process group; COMMAND ends, dlock exits with
// its status and releases the key. SIGHUP and SIGQUIT also end a wait for
// the key, as SIGINT and SIGTERM do.
func TestRunForwardsEverySignal(t *testing.T) {
	for _, tc := range []struct {
		name string // as trap(1) spells it
		sig  syscall.Signal
		stop bool // ends a wait for the key
	}{
		{name: "HUP", sig: syscall.SIGHUP, stop: true},
		{name: "INT", sig: syscall.SIGINT, stop: true},
		{name: "QUIT", sig: syscall.SIGQUIT, stop: true},
		{name: "TERM", sig: syscall.SIGTERM, stop: true},
		{name: "USR1", sig: syscall.SIGUSR1},
		{name: "USR2", sig: syscall.SIGUSR2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			coll := collection(t)
			log := filepath.Join(t.TempDir(), "log")
			// The trap ends the background sleep too: a non-interactive
			// shell starts it with SIGINT and SIGQUIT ignored, and a signal
			// the shell traps is lost if it comes before the sleep starts.
			script := fmt.Sprintf(`trap 'echo %[1]s >>"$LOG"; kill -KILL $! 2>/dev/null; exit 5' %[1]s; echo started; sleep 60 & wait`, tc.name)
			p := start(t, []string{"LOG=" + log}, runArgs(coll, "k", "--", "sh", "-c", script)...)
			require.Equal(t, "started", line(t, p.stdout, "COMMAND started"))
			require.NoError(t, p.cmd.Process.Signal(tc.sig))
			status, _, stderr := p.wait(t)
			assert.Equal(t, 5, status, "stderr: %q", stderr)
			assert.Equal(t, []string{tc.name}, readLog(t, log))
			m := newClient(t, coll).NewMutex("k")
			require.NoError(t, m.TryLock(context.Background()), "dlock did not release the key")
			require.NoError(t, m.Unlock(context.Background()))
			if !tc.stop {
				return
			}

			a := holder(t, coll, "k", "A", log)
			b := start(t, nil, runArgs(coll, "-v", "k", "--", "true")...)
			line(t, b.stderr, "B locking")
			line(t, b.stderr, "B waiting")
			require.NoError(t, b.cmd.Process.Signal(tc.sig))
			status, _, stderr = b.wait(t)
			assert.Equal(t, 128+int(tc.sig), status)
			requireOneLine(t, stderr, fmt.Sprintf(`dlock run: %v while waiting for "k"`, tc.sig))
			a.stdin.Close()
			a.wait(t)
		})
	}
}

// A key used by another kind of primitive is a usage error, which no
// retry mends: status 64, at once, not 69.
func TestKindMismatch(t *testing.T) {
	coll := collection(t)
	other := newClient(t, coll)
	ctx := context.Background()
	_, err := other.NewElection("leader").Campaign(ctx, "db1:5432")
	require.NoError(t, err)
	require.NoError(t, other.NewMutex("job").Lock(ctx))
	require.NoError(t, other.NewRWMutex("table").RLock(ctx))
	for _, tc := range []struct {
		name   string
		args   []string
		stderr string
	}{
		{name: "run on an election", args: runArgs(coll, "leader", "--", "true"),
			stderr: `"leader" is used as an Election, not as a Mutex`},
		{name: "run on an RWMutex", args: runArgs(coll, "-timeout", "10s", "table", "--", "true"),
			stderr: `"table" is used as an RWMutex, not as a Mutex`},
		{name: "elect on a lock", args: electArgs(coll, "job", "db2:5432", "--", "true"),
			stderr: `"job" is used as a Mutex, not as an Election`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, stdout, stderr := dlockRun(t, nil, tc.args...)
			assert.Equal(t, exitUsage, status)
			assert.Empty(t, stdout)
			requireOneLine(t, stderr, tc.stderr)
			assert.Contains(t, stderr[0], "key used by another kind of lock")
		})
	}
}

// A closed standard error (a terminal or ssh session gone) does not end
// dlock when it reports the end of the lease: it still stops COMMAND and
// exits 124, rather than dying of SIGPIPE with COMMAND left running.
func TestRunClosedStderr(t *testing.T) {
	coll := collection(t)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	cmd := exec.Command(binary, runArgs(coll, "-ttl", "1s", "-max-hold", "1s", "k", "--", "sh", "-c", `echo started; exec sleep 60`)...)
	cmd.Stderr = w
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	w.Close()
	r.Close() // dlock's next write to stderr fails
	exited := make(chan []byte, 1)
	go func() {
		out, _ := io.ReadAll(stdout) // to EOF: until COMMAND and dlock have gone
		cmd.Wait()
		exited <- out
	}()
	var out []byte
	select {
	case out = <-exited:
	case <-time.After(watchdog):
		cmd.Process.Kill()
		t.Fatalf("dlock or COMMAND still running %v after -max-hold", watchdog)
	}
	assert.Equal(t, "started\n", string(out))
	assert.Equal(t, exitLost, cmd.ProcessState.ExitCode(), "%v", cmd.ProcessState)
}
