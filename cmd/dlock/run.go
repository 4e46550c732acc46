package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.opentelemetry.io/otel/trace"
)

const runDescription = `
Run takes the lock KEY, waiting while another holds it, runs COMMAND with
DLOCK_KEY, DLOCK_TOKEN (the fencing token of this hold) and DLOCK_OWNER in
its environment, keeps the lock's lease extended while COMMAND runs, and
releases the lock when COMMAND exits. It exits with COMMAND's status.

Given several keys (KEY KEY... -- COMMAND), run takes them all, or none, in
sorted order (a dlock MultiMutex, which never deadlocks with another run on
overlapping keys), and sets DLOCK_KEY_1, DLOCK_TOKEN_1, DLOCK_KEY_2, ... in
that order instead of DLOCK_KEY and DLOCK_TOKEN. The lease is lost when the
hold of any one key is.

If the lease is lost while COMMAND runs (the server could not be reached
for a TTL, this process was frozen, or -max-hold passed), run sends SIGTERM
to COMMAND's process group, SIGKILL after -grace, and exits with status 124.
SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1 and SIGUSR2 sent to run are passed
on to COMMAND's process group; the first four also end a wait for KEY. On
Linux and FreeBSD, COMMAND gets SIGKILL if run is killed.

With TRACEPARENT (and TRACESTATE) in its environment, as CI systems and
otel-cli set them for a traced job, run waits for KEY in that trace: the
hold stores the trace context (dlock status shows its trace id), and
COMMAND gets the same TRACEPARENT. One that is not a valid W3C traceparent
is ignored, with a warning on stderr; it never fails the run. With
OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_TRACES_EXPORTER set, run exports its
spans as the standard OTEL_* exporter settings say (OTLP over HTTP or
gRPC, with TLS, headers, gzip; or console, on stderr); "go doc" in the
source's cmd/dlock has more.

Exit status: COMMAND's (128+N if a signal N killed it); 64 bad usage (or KEY
used by another kind of lock, or -ttl under the server's round trip); 69 could not reach the server; 75 KEY held
(-try, or -timeout passed); 124 the lease was lost; 126 COMMAND could not be
run; 127 COMMAND not found; 128+N signal N ended the wait for KEY.`

// runFlags are the settings of one "dlock run".
type runFlags struct {
	server  serverFlags
	ttl     time.Duration
	try     bool
	timeout time.Duration
	grace   time.Duration
	maxHold time.Duration
	verbose bool
}

func runMain(sub *subcommand, args []string) int {
	var f runFlags
	fs := newFlagSet(sub, runDescription)
	f.server.register(fs)
	fs.DurationVar(&f.ttl, "ttl", dlock.DefaultTTL,
		"the lease's TTL: if this process stops extending the lease (crash, freeze, partition), others can take KEY this long after its last extension")
	fs.BoolVar(&f.try, "try", false,
		"do not wait: if KEY is held, exit at once with status 75 without running COMMAND")
	fs.DurationVar(&f.timeout, "timeout", 0,
		"wait at most this long for KEY, then exit with status 75 without running COMMAND (0: no limit)")
	fs.DurationVar(&f.grace, "grace", 10*time.Second,
		"when the lease is lost, how long COMMAND has to exit after SIGTERM before SIGKILL")
	fs.DurationVar(&f.maxHold, "max-hold", 0,
		"end the hold this long after taking KEY, as a lost lease (COMMAND is stopped, status 124); 0 for no limit, else at least -ttl")
	fs.BoolVar(&f.verbose, "v", false, "report on stderr what run waits for (from the start), when KEY is held, and when run takes it and releases it")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	rest := fs.Args()
	switch {
	case len(rest) == 0:
		return failf(exitUsage, "dlock run: missing KEY -- COMMAND (dlock run -h for help)")
	case slices.Index(rest, "--") < 1 || slices.Index(rest, "--") == len(rest)-1 ||
		slices.ContainsFunc(rest[1:slices.Index(rest, "--")], func(k string) bool { return strings.HasPrefix(k, "-") }): // a flag after KEY
		return failf(exitUsage, "dlock run: want KEY -- COMMAND [ARGS...] (or KEY KEY... --), with the flags before KEY (dlock run -h for help)")
	case f.timeout < 0:
		return failf(exitUsage, "dlock run: -timeout %v is negative", f.timeout)
	case f.grace < 0:
		return failf(exitUsage, "dlock run: -grace %v is negative", f.grace)
	}
	i := slices.Index(rest, "--")
	r := &runner{verb: "run", flags: f, key: rest[0], argv: rest[i+1:]}
	if i > 1 {
		r.keys = rest[:i]
		r.key = strings.Join(rest[:i], " ")
	}
	return r.run()
}

// A runner is one "dlock run" or "dlock elect": it owns the connection,
// the dlock Client, the hold (a Mutex's lease, or a term of leadership)
// and the child, and the main goroutine drives it.
type runner struct {
	verb  string // "run" or "elect": the subcommand, for messages
	flags runFlags
	key   string   // KEY, or the election's NAME; with several keys, them, space-separated
	keys  []string // the keys, when there are several (a MultiMutex), else nil
	argv  []string
	elect bool   // campaign for key with value, rather than lock it
	value string // elect: the leader's value

	parent trace.SpanContext // the job's trace context (TRACEPARENT), or none; set as run starts
	traces *traces           // the Client's tracer provider and exporters when spans are exported, else nil; set as run starts
	mc     *mongo.Client     // set once connected
	client *dlock.Client     // set once connected
	lease  *dlock.Lease      // set once held
	multi  *dlock.MultiLease // with keys: set once held, instead of lease
}

// A hold is what COMMAND runs under: a Lease, or a MultiLease.
type hold interface {
	Lost() <-chan struct{}
	Err() error
	Release(ctx context.Context) error
}

// held returns the hold, or nil when there is none.
func (r *runner) held() hold {
	switch {
	case r.multi != nil:
		return r.multi
	case r.lease != nil:
		return r.lease
	}
	return nil
}

// holdEnv is the environment that names the hold's keys and tokens.
func (r *runner) holdEnv() []string {
	if r.multi == nil {
		return []string{"DLOCK_KEY=" + r.key, "DLOCK_TOKEN=" + strconv.FormatUint(uint64(r.lease.Token()), 10)}
	}
	var env []string
	for i, k := range r.multi.Keys() {
		n := strconv.Itoa(i + 1)
		env = append(env, "DLOCK_KEY_"+n+"="+k, "DLOCK_TOKEN_"+n+"="+strconv.FormatUint(uint64(r.multi.Token(k)), 10))
	}
	return env
}

// errInterrupted is the cause of a wait ended by one of stopSignals.
var errInterrupted = errors.New("interrupted")

func (r *runner) run() int {
	r.startTraces()
	defer r.exportTraces() // last, once the key is released and the signals are no longer caught
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, slices.Concat(stopSignals, passSignals, quietSignals)...)
	defer signal.Stop(sigs)
	defer r.close()

	// The wait for the key runs under the job's trace context, if any:
	// with no recording span, the hold stores it, and names the job's
	// trace (Holders, dlock status).
	r.parent = traceParent(r.verb)
	ctx := r.inJob(context.Background())

	// Connect and take the lock in a goroutine, so that a signal can stop
	// the wait; the goroutine ends when acquire returns, which the
	// cancellation makes prompt.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	acquired := make(chan int, 1)
	go func() { acquired <- r.acquire(ctx) }()
	for {
		select {
		case code := <-acquired:
			if code != 0 {
				return code
			}
			return r.supervise(sigs)
		case sig := <-sigs:
			if !slices.Contains(stopSignals, sig) {
				continue // no COMMAND yet to pass it on to
			}
			cancel(errInterrupted)
			<-acquired // a hold won as the wait was cancelled is released by close
			return failf(signalStatus(sig), "dlock %s: %v while waiting for %q", r.verb, sig, r.key)
		}
	}
}

// acquire connects, takes the lock, and returns 0 or the exit status to
// fail with.
func (r *runner) acquire(ctx context.Context) int {
	mc, coll, err := r.flags.server.connect(ctx)
	switch {
	case context.Cause(ctx) == errInterrupted:
		return 1 // the caller reports the signal
	case errors.Is(err, errUnreachable):
		return failf(exitUnavailable, "dlock %s: %v", r.verb, err)
	case err != nil:
		return failf(exitUsage, "dlock %s: %v", r.verb, err)
	}
	r.mc = mc
	opts := []dlock.Option{dlock.WithTTL(r.flags.ttl), dlock.WithMaxHold(r.flags.maxHold), dlock.WithOwner(ownerLabel())}
	if r.traces != nil {
		opts = append(opts, dlock.WithTracerProvider(r.traces.provider))
	}
	client, err := dlock.NewClient(coll, opts...)
	if err != nil {
		return failf(exitUsage, "dlock %s: %s", r.verb, errorText(err))
	}
	r.client = client

	wait := ctx
	if r.flags.timeout > 0 {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, r.flags.timeout)
		defer cancel()
	}
	if r.elect {
		err = r.campaign(wait)
	} else {
		err = r.lock(wait)
	}
	switch {
	case err == nil:
		if r.flags.verbose {
			what := "holding"
			if r.elect {
				what = "leading"
			}
			if r.multi != nil {
				fmt.Fprintf(os.Stderr, "dlock %s: %s %q with tokens %v\n", r.verb, what, r.key, r.multi.Tokens())
			} else {
				fmt.Fprintf(os.Stderr, "dlock %s: %s %q with token %d\n", r.verb, what, r.key, r.lease.Token())
			}
		}
		return 0
	case context.Cause(ctx) == errInterrupted:
		return 1 // the caller reports the signal
	case errors.Is(err, dlock.ErrLocked):
		return failf(exitHeld, "dlock %s: %q is held by another owner (-try)", r.verb, r.key)
	case errors.Is(err, context.DeadlineExceeded) && wait.Err() != nil:
		return failf(exitHeld, "dlock %s: %q not acquired within -timeout %v: %s", r.verb, r.key, r.flags.timeout, errorText(err))
	case errors.Is(err, dlock.ErrTTLTooShort):
		return failf(exitUsage, "dlock %s: %s (raise -ttl)", r.verb, errorText(err))
	case errors.Is(err, dlock.ErrInvalidKey), errors.Is(err, dlock.ErrInvalidOption),
		errors.Is(err, dlock.ErrKindMismatch), errors.Is(err, dlock.ErrTooManyKeys): // no retry mends these
		return failf(exitUsage, "dlock %s: %s", r.verb, errorText(err))
	default:
		return failf(exitUnavailable, "dlock %s: %s", r.verb, errorText(err))
	}
}

// lock takes the lock KEY (dlock run), and sets r.lease. With -v it says
// first what it waits for, so that no wait is silent, however long the
// server takes to answer.
func (r *runner) lock(wait context.Context) error {
	if r.flags.verbose {
		fmt.Fprintf(os.Stderr, "dlock run: locking %q\n", r.key)
	}
	if r.keys != nil {
		return r.lockAll(wait)
	}
	mu := r.client.NewMutex(r.key)
	err := mu.TryLock(wait)
	if err != nil && !r.flags.try && wait.Err() == nil &&
		!errors.Is(err, dlock.ErrInvalidKey) && !errors.Is(err, dlock.ErrKindMismatch) {
		if errors.Is(err, dlock.ErrLocked) && r.flags.verbose {
			fmt.Fprintf(os.Stderr, "dlock run: %q is held; waiting\n", r.key)
		}
		err = mu.Lock(wait) // retries what waiting may mend
	}
	if err == nil {
		if r.lease = mu.Lease(); r.lease == nil { // lost already (this process was paused)
			err = fmt.Errorf("dlock: the lease on %q was lost as soon as it was taken", r.key)
		}
	}
	return err
}

// lockAll takes every key (dlock run with several keys), and sets
// r.multi, as lock does for one.
func (r *runner) lockAll(wait context.Context) error {
	mu := r.client.NewMultiMutex(r.keys)
	err := mu.TryLock(wait)
	if err != nil && !r.flags.try && wait.Err() == nil &&
		!errors.Is(err, dlock.ErrInvalidKey) && !errors.Is(err, dlock.ErrTooManyKeys) && !errors.Is(err, dlock.ErrKindMismatch) {
		if errors.Is(err, dlock.ErrLocked) && r.flags.verbose {
			fmt.Fprintf(os.Stderr, "dlock run: %q is held; waiting\n", r.key)
		}
		err = mu.Lock(wait)
	}
	if err == nil {
		if r.multi = mu.Lease(); r.multi == nil { // lost already (this process was paused)
			err = fmt.Errorf("dlock: the lease on %q was lost as soon as it was taken", r.key)
		}
	}
	return err
}

// campaign waits until this process leads the election KEY (dlock elect),
// and sets r.lease to the term.
func (r *runner) campaign(wait context.Context) error {
	if r.flags.verbose {
		fmt.Fprintf(os.Stderr, "dlock elect: campaigning for %q\n", r.key)
	}
	l, err := r.client.NewElection(r.key).Campaign(wait, r.value)
	if err == nil {
		r.lease = l
	}
	return err
}

// supervise runs COMMAND under the lease, and returns the exit status.
func (r *runner) supervise(sigs <-chan os.Signal) int {
	lease := r.held()
	cmd := exec.Command(r.argv[0], r.argv[1:]...)
	cmd.Env = append(append(withTraceContext(os.Environ(), r.parent), r.holdEnv()...),
		"DLOCK_OWNER="+r.client.Owner()) // as stored in the lock
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	ownGroup(cmd)
	dieWithParent(cmd)
	exited, err := startCommand(cmd) // exited gets a value when COMMAND ends; waited for below
	if err != nil {
		code := exitCannotRun
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			code = exitNotFound
		}
		return failf(code, "dlock %s: %v", r.verb, err)
	}

	lostCh := lease.Lost()
	var (
		lost  error
		kill  *time.Timer
		killC <-chan time.Time
	)
wait:
	for {
		select {
		case err = <-exited:
			break wait
		case sig := <-sigs:
			if !slices.Contains(quietSignals, sig) {
				signalGroup(cmd, sig)
			}
		case <-lostCh:
			lostCh = nil
			lost = lease.Err()
			fmt.Fprintf(os.Stderr, "dlock %s: %s; stopping COMMAND (SIGTERM, SIGKILL after %v)\n", r.verb, errorText(lost), r.flags.grace)
			signalGroup(cmd, syscall.SIGTERM)
			kill = time.NewTimer(r.flags.grace)
			killC = kill.C
		case <-killC:
			killC = nil
			fmt.Fprintf(os.Stderr, "dlock %s: COMMAND still running %v after SIGTERM; sending SIGKILL\n", r.verb, r.flags.grace)
			signalGroup(cmd, syscall.SIGKILL)
		}
	}
	if kill != nil {
		kill.Stop()
	}
	if lost == nil {
		select {
		case <-lease.Lost(): // lost as COMMAND exited: it may have run unprotected
			lost = lease.Err()
			fmt.Fprintf(os.Stderr, "dlock %s: %s as COMMAND exited\n", r.verb, errorText(lost))
		default:
		}
	}
	if lost != nil {
		signalGroup(cmd, syscall.SIGKILL) // what COMMAND left running in its group
		return exitLost
	}
	return exitStatus(err)
}

// startCommand starts cmd, and returns a channel that gets the error of
// its Wait when it exits.
//
// It starts cmd, and waits for it, on a goroutine locked to its OS thread,
// because Linux sends the parent-death signal (see dieWithParent) when the
// thread that started COMMAND ends, not the process; and the Go runtime
// ends a thread when the goroutine locked to it exits, as the caller's
// might. The locked thread runs nothing else, and lives until COMMAND has
// been reaped.
func startCommand(cmd *exec.Cmd) (<-chan error, error) {
	started := make(chan error, 1)
	exited := make(chan error, 1)
	go func() { // ends when COMMAND does
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}

// close releases the lock, if held, and closes the connection. Each step is
// bounded: a release that gets no answer leaves the key to free itself a
// TTL later. The release runs in the job's trace, as the wait did.
func (r *runner) close() {
	ctx, cancel := context.WithTimeout(r.inJob(context.Background()), max(r.flags.ttl, time.Second))
	defer cancel()
	if lease := r.held(); lease != nil {
		err := lease.Release(ctx)
		switch {
		case err == nil:
			if r.flags.verbose {
				fmt.Fprintf(os.Stderr, "dlock %s: released %q\n", r.verb, r.key)
			}
		case errors.Is(err, dlock.ErrLeaseLost) && errors.Is(lease.Err(), dlock.ErrLeaseLost):
			// Lost, and said so already.
		default:
			fmt.Fprintf(os.Stderr, "dlock %s: release %q: %s (it frees itself within -ttl)\n", r.verb, r.key, errorText(err))
		}
	}
	if r.client != nil {
		r.client.Close(ctx)
	}
	if r.mc != nil {
		r.mc.Disconnect(ctx)
	}
}

// exitStatus is the status to exit with for COMMAND's Wait error: its exit
// status, or 128+N when signal N killed it, as a shell reports it.
func exitStatus(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return failf(exitCannotRun, "dlock: %v", err)
}

// signalStatus is the status of a process that a signal ended, as a shell
// reports it.
func signalStatus(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}

// ownerLabel returns the label of this run's owner identity: its host and
// process, host/pid. The Client adds "#" and 128 random bits, which make
// the identity unique ([dlock.Client.Owner]).
func ownerLabel() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}

// errorText is a library error's message without its "dlock: " prefix,
// which the command's own prefix replaces.
func errorText(err error) string {
	return strings.TrimPrefix(err.Error(), "dlock: ")
}
