// Command mongoserver runs the MongoDB-compatible server that dlock's tests
// use when MONGODB_URI is not set: FerretDB v1.24 embedded, behind a proxy
// that serializes requests (see package testserver). Use it as a local
// server for development:
//
//	go -C tools run ./mongoserver -dir ~/.dlock-dev -addr 127.0.0.1:27017
//
// Once it accepts connections it prints "uri=<connection string>" on
// standard output, then how to stop it on standard error. It runs until
// SIGINT or SIGTERM. With -exit-on-stdin-eof it also stops when its
// standard input closes, so that a parent process (the tests) can hold it
// by a pipe and it cannot outlive the parent.
//
// With -changestreams the server is a one-member replica set with change
// streams (emulated by the proxy, see package testserver; what it does and
// does not emulate is in docs/testing.md), and the URI it prints names the
// set (?replicaSet=rs0), which drivers then check; a client without it
// discovers the set all the same. -history sets how many change events it
// keeps for resuming streams (default 10,000):
//
//	go -C tools run ./mongoserver -changestreams
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/dlock-go/dlock/tools/testserver"
)

func main() {
	var cfg testserver.Config
	flag.StringVar(&cfg.Addr, "addr", "127.0.0.1:0", "TCP address to listen on; port 0 picks a free one")
	flag.StringVar(&cfg.Dir, "dir", "", "data directory (SQLite backend), kept across runs; default: a temporary directory, removed on exit")
	flag.StringVar(&cfg.PostgreSQLURL, "postgresql", "", "run on PostgreSQL at this URL instead of SQLite")
	flag.BoolVar(&cfg.Raw, "raw", false, "no serializing proxy: FerretDB's own, non-atomic findAndModify")
	flag.BoolVar(&cfg.ChangeStreams, "changestreams", false, "be a one-member replica set with change streams (emulated; the URI names the set)")
	flag.IntVar(&cfg.HistorySize, "history", testserver.DefaultHistorySize, "with -changestreams, how many change events to keep for resuming streams")
	exitOnEOF := flag.Bool("exit-on-stdin-eof", false, "also stop when standard input closes (for a parent that holds it by a pipe)")
	flag.Parse()
	log.SetPrefix("mongoserver: ")
	log.SetFlags(0)
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "mongoserver-")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(dir)
		cfg.Dir = dir
	}
	cfg.Log = os.Stderr

	// Listen for signals before announcing the URI: a parent may signal as
	// soon as it has read it.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	srv, err := testserver.Start(cfg)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("uri=%s\n", srv.URI())

	stdinClosed := make(chan struct{}) // never closed without -exit-on-stdin-eof
	if *exitOnEOF {
		go func() { io.Copy(io.Discard, os.Stdin); close(stdinClosed) }()
	} else {
		log.Printf("data in %s; running until SIGINT or SIGTERM (Ctrl-C, or kill %d)", cfg.Dir, os.Getpid())
	}
	select {
	case sig := <-stop:
		if !*exitOnEOF {
			log.Printf("%v: stopping", sig)
		}
	case <-stdinClosed:
	}
	if err := srv.Close(); err != nil && !errors.Is(err, context.Canceled) {
		log.Print(err)
	}
}
