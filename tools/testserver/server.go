// Package testserver runs a MongoDB-compatible server for dlock's tests and
// demonstration: FerretDB v1 (SQLite or PostgreSQL backend) embedded in the
// process, behind a proxy that serializes requests so that single-document
// updates are atomic, as they are on MongoDB.
//
// With [Config.ChangeStreams] the proxy also emulates a one-member replica
// set with change streams, which FerretDB v1 lacks: it answers hello as
// the set's primary, stamps replies with a cluster time, records the
// change events of the writes it forwards, and serves $changeStream
// aggregates from them. It is an emulation, built from MongoDB's
// documentation and the Go driver's tests; docs/testing.md says what it
// does faithfully and what it does not.
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
	// ChangeStreams makes the server a one-member replica set with change
	// streams (an emulation in the proxy; see the package doc). Off, the
	// proxy relays requests as they are. Not with Raw.
	ChangeStreams bool
	// HistorySize is how many change events are kept for resuming streams;
	// 0 means DefaultHistorySize.
	HistorySize int
	// ReplicaSet is the replica set's name; "" means DefaultReplicaSet.
	ReplicaSet string
}

// Server is a running test server.
type Server struct {
	uri     string
	cancel  context.CancelFunc
	done    chan error
	proxy   *serializer
	streams *streams // nil unless Config.ChangeStreams
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
	if cfg.ChangeStreams && cfg.Raw {
		return nil, errors.New("testserver: ChangeStreams needs the proxy, which Raw turns off")
	}
	if cfg.ReplicaSet == "" {
		cfg.ReplicaSet = DefaultReplicaSet
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
		return s, nil
	}
	if err := s.startProxy(cfg, public, fcfg.Listener.Unix); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// startProxy serves clients on public through the proxy to FerretDB's
// socket sock, in replica-set mode if cfg asks, once FerretDB answers.
func (s *Server) startProxy(cfg Config, public net.Listener, sock string) error {
	addr := public.Addr().String()
	s.uri = "mongodb://" + addr + "/"
	if cfg.ChangeStreams {
		var err error
		if s.streams, err = newStreams(sock, addr, cfg.ReplicaSet, cfg.HistorySize); err != nil {
			public.Close()
			return err
		}
		s.uri += "?replicaSet=" + cfg.ReplicaSet
	}
	s.proxy = newSerializer(public, func() (net.Conn, error) { return net.Dial("unix", sock) }, s.streams)
	return waitDial(sock)
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

// URI is the connection string for clients. With ChangeStreams it names
// the replica set (?replicaSet=), which drivers then require of the
// server; a client without it discovers the set all the same.
func (s *Server) URI() string { return s.uri }

// Close stops the server and waits for it: every connection is dropped,
// every change stream's wait ended.
func (s *Server) Close() error {
	if s.streams != nil {
		s.streams.stop()
	}
	if s.proxy != nil {
		s.proxy.Close()
	}
	if s.streams != nil {
		s.streams.close()
	}
	s.cancel()
	return <-s.done
}
