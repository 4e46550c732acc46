// Package testserver runs a MongoDB-compatible server for dlock's tests and
// demonstration: FerretDB v1 (SQLite or PostgreSQL backend) embedded in the
// process, behind a proxy that serializes requests so that single-document
// updates are atomic, as they are on MongoDB.
package testserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
)

// Config says how to run the server.
type Config struct {
	// Addr is the TCP address clients connect to; "127.0.0.1:0" picks a free port.
	Addr string
	// Dir holds the SQLite data; the same Dir across restarts keeps the data.
	Dir string
	// PostgreSQLURL, when set, runs FerretDB on PostgreSQL instead of SQLite.
	PostgreSQLURL string
	// Raw turns the serializing proxy off, exposing FerretDB v1's non-atomic
	// findAndModify. Only for the test that documents that race.
	Raw bool
	// Log receives FerretDB's log; nil discards it.
	Log io.Writer
}

// Server is a running test server.
type Server struct {
	uri    string
	cancel context.CancelFunc
	done   chan error
	proxy  *serializer
}

// Start runs a server until Close.
func Start(cfg Config) (*Server, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.Dir == "" {
		return nil, errors.New("testserver: Dir is required")
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	fcfg := &ferretdb.Config{
		Logger:    slog.New(slog.NewTextHandler(cfg.Log, &slog.HandlerOptions{Level: slog.LevelError + 4})),
		Handler:   "sqlite",
		SQLiteURL: "file:" + filepath.Clean(cfg.Dir) + "/",
	}
	if cfg.PostgreSQLURL != "" {
		fcfg.Handler, fcfg.PostgreSQLURL, fcfg.SQLiteURL = "postgresql", cfg.PostgreSQLURL, ""
	}
	var public net.Listener
	var err error
	if cfg.Raw {
		fcfg.Listener.TCP = cfg.Addr
	} else {
		// FerretDB listens on a private socket; clients reach it through the proxy.
		fcfg.Listener.Unix = filepath.Join(cfg.Dir, "ferretdb.sock")
		os.Remove(fcfg.Listener.Unix)
		if public, err = net.Listen("tcp", cfg.Addr); err != nil {
			return nil, err
		}
	}
	f, err := ferretdb.New(fcfg)
	if err != nil {
		if public != nil {
			public.Close()
		}
		return nil, fmt.Errorf("testserver: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- f.Run(ctx) }()
	if cfg.Raw {
		s.uri = f.MongoDBURI()
	} else {
		sock := fcfg.Listener.Unix
		s.proxy = newSerializer(public, func() (net.Conn, error) { return net.Dial("unix", sock) })
		s.uri = "mongodb://" + public.Addr().String() + "/"
		if err := waitDial(sock); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

func waitDial(sock string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testserver: FerretDB did not start: %w", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// URI is the connection string for clients.
func (s *Server) URI() string { return s.uri }

// Close stops the server and waits for it.
func (s *Server) Close() error {
	if s.proxy != nil {
		s.proxy.Close()
	}
	s.cancel()
	return <-s.done
}
