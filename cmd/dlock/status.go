package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
)

const statusDescription = `
Status shows who holds the lock KEY (or leads the election KEY), as one
read of its document shows it: for each hold, its fencing token, whether it
is exclusive or shared (a read hold or a semaphore permit), its owner and
its data (an election leader's value), and the trace id of the span that
took it, when the holder's Lock ran under a traced context: paste it into
the tracing UI to see what the holder is doing. A hold whose owner crashed
is shown until another process takes the key over. Status takes nothing
and changes nothing.

Text output is one line per hold, in token order:

	token 7 exclusive owner host/4242#9f86d081884c7d65a2b0e1f7c4d3a9b8 data "db1:5432" trace 4bf92f3577b34da6a3ce929d0e0e4736

or, when nobody holds KEY, one line: "KEY" is free. A waiter registered
in KEY's queue gets a line "waiting owner OWNER": while one is, run -try
fails on KEY (until the waiter takes it, or, once its process stopped,
two TTLs after KEY's document was last written). With -json, one object: {"key": KEY, "free": bool, "holders":
[{"owner", "token", "shared", "data", "trace_id", "span_id", "waiting"}]},
data as a string (or "data_base64" when it is not UTF-8), and the ids in
hex; each omitted when the hold has none; waiting true for a registered
waiter.

Exit status: 0 whether KEY is held or free; 64 bad usage; 69 could not
reach the server.`

// statusHolder is one hold in status's JSON output.
type statusHolder struct {
	Owner      string      `json:"owner"`
	Token      dlock.Token `json:"token"`
	Shared     bool        `json:"shared"`
	Waiting    bool        `json:"waiting,omitempty"` // a registered waiter, not a hold
	Data       *string     `json:"data,omitempty"`
	DataBase64 []byte      `json:"data_base64,omitempty"`
	TraceID    string      `json:"trace_id,omitempty"` // the span that took the hold, in hex
	SpanID     string      `json:"span_id,omitempty"`
}

// statusReport is status's JSON output.
type statusReport struct {
	Key     string         `json:"key"`
	Free    bool           `json:"free"`
	Holders []statusHolder `json:"holders"`
}

func statusMain(sub *subcommand, args []string) int {
	var server serverFlags
	var asJSON bool
	fs := newFlagSet(sub, statusDescription)
	server.register(fs)
	fs.BoolVar(&asJSON, "json", false, "print one JSON object instead of text")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	rest := fs.Args()
	switch {
	case len(rest) == 0:
		return failf(exitUsage, "dlock status: missing KEY (dlock status -h for help)")
	case len(rest) > 1:
		return failf(exitUsage, "dlock status: want one KEY, with the flags before it (dlock status -h for help)")
	}
	key := rest[0]

	ctx := context.Background()
	mc, coll, err := server.connect(ctx)
	switch {
	case errors.Is(err, errUnreachable):
		return failf(exitUnavailable, "dlock status: %v", err)
	case err != nil:
		return failf(exitUsage, "dlock status: %v", err)
	}
	defer mc.Disconnect(context.Background())
	client, err := dlock.NewClient(coll)
	if err != nil {
		return failf(exitUsage, "dlock status: %s", errorText(err))
	}
	defer client.Close(context.Background())
	ctx, cancel := context.WithTimeout(ctx, server.connectTimeout)
	defer cancel()
	holders, err := client.Holders(ctx, key)
	switch {
	case errors.Is(err, dlock.ErrInvalidKey):
		return failf(exitUsage, "dlock status: %s", errorText(err))
	case err != nil:
		return failf(exitUnavailable, "dlock status: %s", errorText(err))
	}

	if asJSON {
		printJSON(key, holders)
	} else {
		printText(key, holders)
	}
	return 0
}

// printJSON prints status's report on key's holders as JSON.
func printJSON(key string, holders []dlock.Holder) {
	report := statusReport{Key: key, Free: held(holders) == 0, Holders: []statusHolder{}}
	for _, h := range holders {
		sh := statusHolder{Owner: h.Owner, Token: h.Token, Shared: h.Shared, Waiting: h.Waiting}
		if h.TraceID.IsValid() {
			sh.TraceID, sh.SpanID = h.TraceID.String(), h.SpanID.String()
		}
		switch {
		case h.Data == nil:
		case utf8.Valid(h.Data):
			s := string(h.Data)
			sh.Data = &s
		default:
			sh.DataBase64 = h.Data
		}
		report.Holders = append(report.Holders, sh)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(report)
}

// printText prints status's report on key's holders as text, a line each.
func printText(key string, holders []dlock.Holder) {
	switch n := len(holders) - held(holders); {
	case len(holders) == 0:
		fmt.Printf("%q is free\n", key)
		return
	case n == len(holders):
		fmt.Printf("%q is free, but %d registered waiters block -try until they take it or are cleared\n", key, n)
	}
	for _, h := range holders {
		if h.Waiting {
			fmt.Printf("waiting owner %s\n", h.Owner)
			continue
		}
		mode := "exclusive"
		if h.Shared {
			mode = "shared"
		}
		line := fmt.Sprintf("token %d %s owner %s", h.Token, mode, h.Owner)
		if h.Data != nil {
			line += fmt.Sprintf(" data %q", h.Data)
		}
		if h.TraceID.IsValid() {
			line += " trace " + h.TraceID.String()
		}
		fmt.Println(line)
	}
}

// held counts the holds among holders: the rest are registered waiters.
func held(holders []dlock.Holder) int {
	n := 0
	for _, h := range holders {
		if !h.Waiting {
			n++
		}
	}
	return n
}
