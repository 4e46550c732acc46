// Command mongoserver runs the MongoDB-compatible test server that dlock's
// tests use when MONGODB_URI is not set: FerretDB v1.24 embedded, behind a
// proxy that serializes requests (see package testserver). It prints
// "uri=<connection string>" on standard output once it accepts connections
// and runs until it is signalled or its standard input closes.
package main

import (
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
	flag.StringVar(&cfg.Addr, "addr", "127.0.0.1:0", "TCP address to listen on")
	flag.StringVar(&cfg.Dir, "dir", "", "data directory (SQLite backend); default: a new temporary directory")
	flag.StringVar(&cfg.PostgreSQLURL, "postgresql", "", "run on PostgreSQL at this URL instead of SQLite")
	flag.BoolVar(&cfg.Raw, "raw", false, "no serializing proxy: FerretDB's own, non-atomic findAndModify")
	flag.Parse()
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "mongoserver-")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(dir)
		cfg.Dir = dir
	}
	cfg.Log = os.Stderr
	srv, err := testserver.Start(cfg)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("uri=%s\n", srv.URI())

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	stdinClosed := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stdinClosed) }()
	select {
	case <-stop:
	case <-stdinClosed:
	}
	srv.Close()
}
