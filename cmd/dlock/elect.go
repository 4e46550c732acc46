package main

import (
	"time"

	"github.com/dlock-go/dlock"
)

const electDescription = `
Elect campaigns in the election NAME with VALUE as this process's value,
waiting while another process leads, and once this process leads runs
COMMAND with DLOCK_KEY (NAME), DLOCK_TOKEN (the fencing token of this term
of leadership) and DLOCK_OWNER in its environment. Leadership is kept
while COMMAND runs, and given up when COMMAND exits; elect then exits with
COMMAND's status. "dlock status NAME" shows the leader, and VALUE as its
data.

If leadership is lost while COMMAND runs (the server could not be reached
for a TTL, this process was frozen, or -max-hold passed), elect sends
SIGTERM to COMMAND's process group, SIGKILL after -grace, and exits with
status 124. Signals sent to elect are handled as by run: SIGHUP, SIGINT,
SIGQUIT, SIGTERM, SIGUSR1 and SIGUSR2 are passed on to COMMAND's process
group, the first four also end the campaign, and on Linux and FreeBSD
COMMAND gets SIGKILL if elect is killed. TRACEPARENT is read, and passed
on to COMMAND, and spans are exported (OTEL_*), as by run.

Exit status: COMMAND's (128+N if a signal N killed it); 64 bad usage (or
NAME used by a lock); 69 could not reach the server; 75 -timeout passed
before this process led; 124 leadership was lost; 126 COMMAND could not be
run; 127 COMMAND not found; 128+N signal N ended the campaign.`

func electMain(sub *subcommand, args []string) int {
	var f runFlags
	fs := newFlagSet(sub, electDescription)
	f.server.register(fs)
	fs.DurationVar(&f.ttl, "ttl", dlock.DefaultTTL,
		"the term's TTL: if this process stops extending it (crash, freeze, partition), another can lead this long after its last extension")
	fs.DurationVar(&f.timeout, "timeout", 0,
		"campaign at most this long, then exit with status 75 without running COMMAND (0: no limit)")
	fs.DurationVar(&f.grace, "grace", 10*time.Second,
		"when leadership is lost, how long COMMAND has to exit after SIGTERM before SIGKILL")
	fs.DurationVar(&f.maxHold, "max-hold", 0,
		"give leadership up this long after winning it, as lost (COMMAND is stopped, status 124); 0 for no limit, else at least -ttl")
	fs.BoolVar(&f.verbose, "v", false, "report on stderr when elect campaigns, leads and resigns")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	rest := fs.Args()
	switch {
	case len(rest) == 0:
		return failf(exitUsage, "dlock elect: missing NAME VALUE -- COMMAND (dlock elect -h for help)")
	case len(rest) < 4 || rest[2] != "--":
		return failf(exitUsage, "dlock elect: want NAME VALUE -- COMMAND [ARGS...], with the flags before NAME (dlock elect -h for help)")
	case f.timeout < 0:
		return failf(exitUsage, "dlock elect: -timeout %v is negative", f.timeout)
	case f.grace < 0:
		return failf(exitUsage, "dlock elect: -grace %v is negative", f.grace)
	}
	r := &runner{verb: "elect", flags: f, key: rest[0], elect: true, value: rest[1], argv: rest[3:]}
	return r.run()
}
