// Dlock runs commands under distributed locks, or while leading an
// election, kept in MongoDB, and shows who holds a lock; with the
// guarantees of the dlock library (github.com/dlock-go/dlock): at most one
// holder of a key at a time across machines, a lease that is extended while
// the holder lives and lapses when it dies, and a fencing token for each
// hold.
//
// Install it with
//
//	go install github.com/dlock-go/dlock/cmd/dlock@latest
//
// cmd/dlock is a module of its own, so that the library's users do not get
// the exporters' modules in their build lists. Its go.mod requires the
// library by version; in a clone, cmd/dlock/go.work builds it with the
// library as checked out instead ("go -C cmd/dlock install").
//
// Usage:
//
//	dlock SUBCOMMAND [flags] ARGS...
//	dlock -h                  lists the subcommands
//	dlock SUBCOMMAND -h       explains one, and its flags
//
// # dlock run
//
//	dlock run [flags] KEY [KEY...] -- COMMAND [ARGS...]
//
// Run takes the lock KEY, waiting while another process holds it, then runs
// COMMAND with these variables added to its environment:
//
//	DLOCK_KEY     KEY
//	DLOCK_TOKEN   the fencing token of this hold, a decimal number that
//	              grows with every hold of KEY: pass it to the storage
//	              COMMAND writes, to turn away a late writer
//	DLOCK_OWNER   this run's owner identity, as stored in the lock and
//	              as dlock status shows it: host/pid, "#" and 128
//	              random bits in hex
//
// and TRACEPARENT and TRACESTATE, as run got them (see Traces below).
//
// Given several keys, run takes them all or none, in sorted order, as a
// dlock MultiMutex does (two runs on overlapping keys never deadlock), and
// sets DLOCK_KEY_1 and DLOCK_TOKEN_1, DLOCK_KEY_2 and DLOCK_TOKEN_2, and
// so on, in that order, instead of DLOCK_KEY and DLOCK_TOKEN. The lease is
// lost, as below, when the hold of any one key is.
//
// While COMMAND runs, the lock's lease is extended in the background (every
// third of -ttl). COMMAND's standard input, output and error are run's.
// When COMMAND exits, run releases the lock and exits with COMMAND's status.
//
// If the lease is lost while COMMAND runs (the server could not be reached
// for about a TTL, this process was frozen for longer than that and another
// took the key, or -max-hold passed), COMMAND may no longer rely on the
// lock: run sends SIGTERM to COMMAND's process group, SIGKILL after -grace
// if it is still running, and exits with status 124. The lease is lost at
// its local deadline, before any other process can take the key; but a
// process that was frozen can wake after that, so writes that must never
// overlap should be fenced with DLOCK_TOKEN (see the library's
// documentation).
//
// COMMAND runs in a process group of its own, as under timeout(1), so that
// these signals reach whatever COMMAND started, and so do the signals run
// passes on (a Ctrl-C at a terminal reaches COMMAND through run, once; see
// Signals below). A COMMAND in its own group cannot read from the
// terminal. What COMMAND leaves running in the background when it exits is
// not stopped, unless the lease was lost.
//
// Flags:
//
//	-uri string              the MongoDB connection string (default $MONGODB_URI)
//	-db string               the database of the lock collection (default "dlock")
//	-collection string       the collection of lock documents, one per key
//	                         (default "locks"); every program that shares the
//	                         locks must use the same one
//	-connect-timeout dur     how long to try to reach the server (default 10s)
//	-ttl dur                 the lease's TTL (default 10s): if this process stops
//	                         extending the lease, others can take KEY this long
//	                         after its last extension
//	-try                     do not wait: if KEY is held, exit at once with 75
//	-timeout dur             wait at most this long for KEY, then exit with 75
//	                         (default 0: no limit)
//	-grace dur               after SIGTERM on a lost lease, how long COMMAND has
//	                         before SIGKILL (default 10s)
//	-max-hold dur            end the hold this long after taking KEY, as a lost
//	                         lease (default 0: no limit; else at least -ttl);
//	                         others can take KEY at most a TTL later
//	-v                       report on stderr what run waits for (from the
//	                         start, before the server answers), when KEY is
//	                         held, and when run takes KEY and releases it
//
// Flags go before KEY; "--" separates KEY from COMMAND.
//
// # dlock elect
//
//	dlock elect [flags] NAME VALUE -- COMMAND [ARGS...]
//
// Elect runs COMMAND while this process leads the election NAME (a
// dlock.Election; its key is NAME, which no lock may use as well). It
// campaigns with VALUE as its value, waiting while another process leads,
// then runs COMMAND as run does: the same environment (DLOCK_KEY is NAME,
// DLOCK_TOKEN the term's fencing token, which grows with every term), the
// same process group and signals, the same exit statuses. When COMMAND
// exits, elect resigns, and the next campaigner leads at once. If
// leadership is lost while COMMAND runs (this process could not reach the
// server, or was frozen, for about a TTL), COMMAND gets SIGTERM, SIGKILL
// after -grace, and elect exits with 124; a process that crashed is
// replaced within two TTLs of its last extension.
//
// Flags: -uri, -db, -collection, -connect-timeout, -ttl, -grace,
// -max-hold and -v as for run, and
//
//	-timeout dur             campaign at most this long, then exit with 75
//	                         without running COMMAND (default 0: no limit)
//
// Flags go before NAME; "--" separates VALUE from COMMAND. Run one on each
// machine that may host a singleton service:
//
//	dlock elect -ttl 15s scheduler "$(hostname):8080" -- /usr/local/bin/scheduler
//
// # dlock status
//
//	dlock status [flags] KEY
//
// Status shows who holds the lock KEY, or leads the election KEY, as one
// read of its document shows it; it takes nothing and changes nothing. It
// prints one line per hold, in token order: the fencing token, exclusive
// or shared (a read hold or a semaphore permit), the owner (host/pid#random
// for a dlock process), the hold's data when it has some (an election's
// value), quoted, and the trace id of the call that took it when it ran in
// a trace (see Traces):
//
//	token 7 exclusive owner web3/4242#9f86d081884c7d65a2b0e1f7c4d3a9b8 data "web3:8080"
//
// or, when nobody holds KEY, "KEY" is free. A waiter registered in KEY's
// queue gets a line "waiting owner OWNER" after the holds: while one is
// registered, run -try fails on KEY even when nobody holds it, until the
// waiter takes it or, once its process stopped, a try clears it (two
// TTLs after KEY's document was last written: a registration lasts two
// TTLs). With -json it prints one object instead:
//
//	{"key": "scheduler", "free": false, "holders": [{"owner": "web3/...",
//	 "token": 7, "shared": false, "data": "web3:8080"}]}
//
// where data is omitted when the hold has none, and is data_base64 instead
// when it is not UTF-8; trace_id and span_id, in hex, are there when the
// hold stored a trace context. A hold whose owner crashed is shown until another
// process takes the key over. Status exits with 0 whether KEY is held or
// free, 64 on bad usage and 69 when the server cannot be reached. Flags:
// -uri, -db, -collection, -connect-timeout as for run, and -json.
//
// # Signals
//
// Run and elect pass SIGHUP, SIGINT, SIGQUIT and SIGTERM on to COMMAND's
// process group: the signals that ask a process to end, which timeout(1)
// passes on as well (a closed terminal or ssh session sends SIGHUP, Ctrl-C
// SIGINT, Ctrl-\ SIGQUIT). They do not end run: it waits for COMMAND to
// exit, holding KEY meanwhile, then releases KEY and exits with COMMAND's
// status; a COMMAND that ignores them runs on, under the lock. While run
// waits for KEY (elect campaigns), they end the wait: COMMAND does not run,
// and the status is 128+N. SIGUSR1 and SIGUSR2 are passed on to COMMAND's
// group as well, for a COMMAND that reloads or reopens its logs on them,
// and ignored while run waits. SIGPIPE does not end run: a write to a
// closed standard output or error fails, and run carries on.
//
// SIGKILL cannot be caught. On Linux and FreeBSD, run has the kernel send
// COMMAND SIGKILL when run dies, so that a run killed by SIGKILL, by the
// OOM killer, or by a signal it does not catch (SIGABRT) takes COMMAND
// with it. What that leaves, where a process can run on after run has
// stopped extending the lease:
//
//   - On other systems (macOS, OpenBSD, Windows), a run killed that way
//     leaves COMMAND running.
//   - The kernel's SIGKILL reaches COMMAND alone, not the processes it
//     started: the command a shell script is running runs on. A script
//     should exec its last command, which then is COMMAND.
//   - A set-user-ID or set-group-ID COMMAND (sudo) loses the kernel's
//     SIGKILL as it starts.
//   - A process that COMMAND puts in a process group or session of its own
//     (setsid, a daemon) gets none of the signals run sends.
//   - SIGSTOP and SIGTSTP (Ctrl-Z) stop run alone: COMMAND runs on while
//     the lease is not extended, as under a frozen run, until run resumes
//     and stops it for the lost lease.
//
// Others can take KEY a TTL after run's last extension, while such a
// process still runs: fence what it writes with DLOCK_TOKEN.
//
// # Traces
//
// Run and elect read TRACEPARENT, and TRACESTATE with it, from their
// environment: the W3C trace context that CI systems and otel-cli set for
// the steps of a traced job. The wait for KEY is then part of the job's
// trace: the hold stores the trace context, so that dlock status shows its
// trace id and the Lock span of a traced program waiting for KEY links to
// the job. COMMAND gets the same TRACEPARENT and TRACESTATE (as W3C version
// 00; a TRACESTATE that does not parse is dropped), so that its steps stay
// in the job's trace, beside the wait.
//
// A TRACEPARENT that is not a valid W3C traceparent (00-TRACEID-SPANID-FLAGS
// in lower-case hex, with ids not all zero) is ignored with a warning on
// standard error, and left in COMMAND's environment as it was: it never
// fails the run.
//
// Run and elect export their spans, with the OpenTelemetry Go SDK and its
// exporters, when the standard OTEL_* variables ask for it: when
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set,
// or OTEL_TRACES_EXPORTER names an exporter. The spans are the wait for KEY
// (a dlock.TryLock span, then dlock.Lock if KEY was held; dlock.Campaign
// for elect), the release, and a lost lease. The wait's span is a child of
// TRACEPARENT, and the hold stores it, not TRACEPARENT. Spans go in batches
// as they end (every 5 s, OTEL_BSP_SCHEDULE_DELAY), and the rest as run
// exits, after the release.
//
// Run honours the standard OTEL_* exporter settings; the _TRACES_ variant
// of an OTEL_EXPORTER_OTLP_ one (OTEL_EXPORTER_OTLP_TRACES_HEADERS, ...)
// wins over it:
//
//	OTEL_TRACES_EXPORTER  otlp, console or none, or a comma-separated list;
//	    unset, otlp when an endpoint is set, else none (an SDK would send
//	    to localhost). console writes each span as a line of JSON to
//	    standard error, leaving standard output to COMMAND
//	OTEL_EXPORTER_OTLP_PROTOCOL  http/protobuf (the default), http/json,
//	    or grpc; run warns of another value, and sends http/protobuf
//	OTEL_EXPORTER_OTLP_ENDPOINT  the collector's base URL: HTTP requests
//	    go to its path with /v1/traces added, _TRACES_ENDPOINT's as it is
//	    (with OTEL_TRACES_EXPORTER=otlp and no endpoint, the Go exporters'
//	    default: localhost, port 4318, or 4317 for grpc, over TLS)
//	OTEL_EXPORTER_OTLP_HEADERS  key=value,... added to each request, each
//	    value percent-decoded
//	OTEL_EXPORTER_OTLP_CERTIFICATE  a PEM file of the CA certificates to
//	    trust, for a collector whose certificate a private CA signed
//	OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, _CLIENT_KEY  PEM files of the
//	    certificate and key to present, for mutual TLS
//	OTEL_EXPORTER_OTLP_COMPRESSION  gzip, or none (the default)
//	OTEL_EXPORTER_OTLP_TIMEOUT  in milliseconds (default 10000): how long
//	    an export may take, retries included; but run waits 3 s at most
//	OTEL_SERVICE_NAME  the spans' service.name (default "dlock")
//	OTEL_RESOURCE_ATTRIBUTES  key=value,... more of the spans' resource
//	OTEL_SDK_DISABLED=true  export nothing
//
// and the Go SDK's other settings, such as OTEL_EXPORTER_OTLP_INSECURE,
// OTEL_TRACES_SAMPLER and OTEL_BSP_SCHEDULE_DELAY. A request that the
// collector answers with 429, 502, 503 or 504 (over gRPC, UNAVAILABLE and
// the other codes the OTLP specification calls retryable) is sent again,
// first after about 200 ms, until the export's time is up.
// Requests name the exporter in their User-Agent ("OTel OTLP Exporter
// Go/" and its version).
//
// A wait under a TRACEPARENT that is not sampled records no span. A
// setting that cannot be read, and an export that fails (refused, an error
// status, no answer in time), is one warning on standard error; it never
// changes the exit status. Without an endpoint or OTEL_TRACES_EXPORTER,
// run sets up no tracer and exports nothing.
//
// # Exit status
//
// Run and elect exit with COMMAND's status, or 128+N when signal N killed
// COMMAND (as a shell reports it), except:
//
//	64   bad usage: an unknown flag, a bad value, a missing KEY, "--" or
//	     COMMAND, an invalid key (empty, over 1024 bytes, not UTF-8, NUL),
//	     or a key used by another kind of lock (run on an election's NAME,
//	     or on a key another program uses as an RWMutex or a Semaphore;
//	     elect on a lock's KEY), or a -ttl shorter than the server's
//	     round trip (every acquire answered after its lease's deadline):
//	     no retry mends these
//	69   could not reach the server within -connect-timeout, or it failed
//	75   KEY is held: -try found it held, or -timeout passed (elect:
//	     another process still led); COMMAND did not run
//	124  the lease (elect: leadership) was lost while COMMAND ran;
//	     COMMAND was stopped
//	126  COMMAND could not be run
//	127  COMMAND was not found
//	129, 130, 131, 143  run or elect got SIGHUP, SIGINT, SIGQUIT or
//	     SIGTERM while waiting for KEY (128+N)
//
// Errors are one line on standard error, starting "dlock".
//
// # Example
//
// Every five minutes, make the report on whichever machine gets the lock,
// and skip the run on the others (status 75) while one is still at it:
//
//	MONGODB_URI=mongodb://db1.example.com:27017,db2.example.com:27017/?replicaSet=rs0
//	*/5 * * * * dlock run -try nightly-report -- /usr/local/bin/report
package main
