package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
)

// Exit statuses of dlock's own (COMMAND's status passes through). The
// package documentation lists them for users; keep the two in step.
const (
	exitUsage       = 64  // EX_USAGE: a bad flag or argument
	exitUnavailable = 69  // EX_UNAVAILABLE: could not reach the server, or it failed
	exitHeld        = 75  // EX_TEMPFAIL: the key is held (-try, or -timeout passed)
	exitLost        = 124 // as timeout(1) when it stops COMMAND: the lease was lost
	exitCannotRun   = 126 // COMMAND could not be run (as the shell)
	exitNotFound    = 127 // COMMAND not found (as the shell)
)

// A subcommand is one verb of dlock: "dlock NAME [flags] ARGS".
type subcommand struct {
	name    string
	args    string // the synopsis after the name and flags
	summary string
	run     func(sub *subcommand, args []string) int // returns the exit status
}

// subcommands is the table main dispatches on, in the order usage lists
// them. Add a verb by adding a row (and a section in doc.go).
var subcommands = []*subcommand{
	{name: "run", args: "KEY [KEY...] -- COMMAND [ARGS...]", summary: "run COMMAND while holding the lock KEY (or all the KEYs)", run: runMain},
	{name: "elect", args: "NAME VALUE -- COMMAND [ARGS...]", summary: "run COMMAND while this process leads the election NAME", run: electMain},
	{name: "status", args: "KEY", summary: "show who holds the lock KEY (or leads the election KEY)", run: statusMain},
}

func main() {
	os.Exit(dlockMain(os.Args[1:]))
}

// dlockMain runs dlock with args (without the program name) and returns
// the exit status.
func dlockMain(args []string) int {
	if len(args) == 0 {
		usage(os.Stderr)
		return exitUsage
	}
	switch name := args[0]; name {
	case "-h", "-help", "--help":
		usage(os.Stdout)
		return 0
	case "help":
		if len(args) == 1 {
			usage(os.Stdout)
			return 0
		}
		if sub := lookup(args[1]); sub != nil {
			return sub.run(sub, []string{"-h"})
		}
		return failf(exitUsage, "dlock: unknown subcommand %q (dlock -h lists them)", args[1])
	default:
		if sub := lookup(name); sub != nil {
			return sub.run(sub, args[1:])
		}
		if strings.HasPrefix(name, "-") {
			return failf(exitUsage, "dlock: flags go after the subcommand: dlock SUBCOMMAND [flags] ... (dlock -h lists them)")
		}
		return failf(exitUsage, "dlock: unknown subcommand %q (dlock -h lists them)", name)
	}
}

func lookup(name string) *subcommand {
	for _, sub := range subcommands {
		if sub.name == name {
			return sub
		}
	}
	return nil
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "dlock runs commands under distributed locks kept in MongoDB.\n\nusage:\n")
	for _, sub := range subcommands {
		fmt.Fprintf(w, "  dlock %s [flags] %s\n", sub.name, sub.args)
	}
	fmt.Fprintf(w, "\nsubcommands:\n")
	for _, sub := range subcommands {
		fmt.Fprintf(w, "  %-8s %s\n", sub.name, sub.summary)
	}
	fmt.Fprintf(w, "\n\"dlock SUBCOMMAND -h\" explains a subcommand and its flags.\n")
}

// failf prints a one-line message on stderr and returns code.
func failf(code int, format string, args ...any) int {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintln(os.Stderr, strings.Join(strings.Fields(msg), " "))
	return code
}

// newFlagSet returns the flag set of sub, whose -h prints description and
// the flags.
func newFlagSet(sub *subcommand, description string) *flag.FlagSet {
	fs := flag.NewFlagSet("dlock "+sub.name, flag.ContinueOnError)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: dlock %s [flags] %s\n\n%s\n\nflags:\n", sub.name, sub.args, strings.TrimSpace(description))
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args into fs. On -h it prints the usage on stdout;
// on a bad flag, one line on stderr. ok is false when the caller is to
// return code.
func parseFlags(fs *flag.FlagSet, args []string) (code int, ok bool) {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(os.Stdout)
		fs.Usage()
		return 0, false
	case err != nil:
		return failf(exitUsage, "%s: %v (%s -h for help)", fs.Name(), err, fs.Name()), false
	}
	return 0, true
}

// serverFlags are the flags that say where the locks are, common to the
// subcommands.
type serverFlags struct {
	uri            string
	db             string
	collection     string
	connectTimeout time.Duration
}

func (f *serverFlags) register(fs *flag.FlagSet) {
	// The default is read after parsing, so that -h does not print it (it
	// may hold a password).
	fs.StringVar(&f.uri, "uri", "", "the MongoDB connection string (default $MONGODB_URI)")
	fs.StringVar(&f.db, "db", "dlock", "the database that holds the lock collection")
	fs.StringVar(&f.collection, "collection", "locks",
		"the collection of lock documents, one per key (shared by every program that uses the same locks)")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", 10*time.Second,
		"how long to try to reach the server before giving up")
}

// errUnreachable marks a failure to reach the server, as opposed to a bad
// connection string.
var errUnreachable = errors.New("could not reach the server")

// connect connects to the server and checks, with a ping bounded by
// -connect-timeout (and ctx), that it answers. An error that does not
// match errUnreachable is a bad setting.
func (f *serverFlags) connect(ctx context.Context) (*mongo.Client, *mongo.Collection, error) {
	uri := f.uri
	if uri == "" {
		uri = os.Getenv("MONGODB_URI")
	}
	if uri == "" {
		return nil, nil, errors.New("no server: set -uri or MONGODB_URI")
	}
	if f.connectTimeout <= 0 {
		return nil, nil, fmt.Errorf("-connect-timeout %v is not positive", f.connectTimeout)
	}
	mc, err := mongo.Connect(options.Client().ApplyURI(uri).SetAppName("dlock").
		SetServerSelectionTimeout(f.connectTimeout).SetConnectTimeout(f.connectTimeout))
	if err != nil {
		return nil, nil, fmt.Errorf("-uri: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, f.connectTimeout)
	defer cancel()
	if err := mc.Ping(ctx, readpref.Primary()); err != nil {
		mc.Disconnect(context.Background())
		return nil, nil, fmt.Errorf("%w: %w", errUnreachable, err)
	}
	return mc, mc.Database(f.db).Collection(f.collection), nil
}
