package testserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// Wire protocol constants (MongoDB wire protocol, "Standard Message Header").
const (
	headerLen   = 16
	opMsg       = 2013
	moreToCome  = 1 << 1
	maxMsgBytes = 48 << 20
)

// serializer forwards MongoDB wire-protocol traffic to a backend, one
// request/reply pair at a time across all client connections. FerretDB v1
// applies a findAndModify as read, modify in Go, write back, with nothing to
// stop a racing client in between; letting only one request reach it at a
// time restores MongoDB's single-document atomicity.
type serializer struct {
	ln      net.Listener
	dial    func() (net.Conn, error)
	turn    sync.Mutex // held from writing a request to reading its reply
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	closing bool
	// cs, when set, serves each connection in replica-set mode with change
	// streams instead of relaying it as it is; set before accept starts.
	cs *streams
}

func newSerializer(ln net.Listener, dial func() (net.Conn, error), cs *streams) *serializer {
	s := &serializer{ln: ln, dial: dial, conns: map[net.Conn]struct{}{}, cs: cs}
	if cs != nil {
		cs.proxy = s
	}
	s.wg.Add(1)
	go s.accept()
	return s
}

func (s *serializer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		b, err := s.dial()
		if err != nil {
			c.Close()
			continue
		}
		if !s.track(c, b) {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.untrack(c, b)
			if s.cs != nil {
				s.cs.serve(c, b)
				return
			}
			s.pump(c, b)
		}()
	}
}

func (s *serializer) track(conns ...net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		s.conns[c] = struct{}{}
	}
	return true
}

func (s *serializer) untrack(conns ...net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range conns {
		c.Close()
		delete(s.conns, c)
	}
}

// pump relays requests from client to backend and the replies back.
func (s *serializer) pump(client, backend net.Conn) {
	for {
		req, err := readMessage(client)
		if err != nil {
			return
		}
		reply, err := s.roundTrip(backend, req)
		if err != nil {
			return
		}
		if reply != nil {
			if _, err := client.Write(reply); err != nil {
				return
			}
		}
	}
}

func (s *serializer) roundTrip(backend net.Conn, req []byte) ([]byte, error) {
	s.turn.Lock()
	defer s.turn.Unlock()
	return s.exchange(backend, req)
}

// exchange sends req and reads its reply; the caller holds the turn.
func (s *serializer) exchange(backend net.Conn, req []byte) ([]byte, error) {
	if _, err := backend.Write(req); err != nil {
		return nil, err
	}
	if expectsNoReply(req) {
		return nil, nil
	}
	return readMessage(backend)
}

func expectsNoReply(msg []byte) bool {
	op := binary.LittleEndian.Uint32(msg[12:16])
	return op == opMsg && len(msg) >= headerLen+4 &&
		binary.LittleEndian.Uint32(msg[headerLen:headerLen+4])&moreToCome != 0
}

func readMessage(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(hdr[:]))
	if n < headerLen || n > maxMsgBytes {
		return nil, fmt.Errorf("testserver: bad message length %d", n)
	}
	msg := make([]byte, n)
	copy(msg, hdr[:])
	if _, err := io.ReadFull(r, msg[4:]); err != nil {
		return nil, err
	}
	return msg, nil
}

// dropConns closes every connection, client and backend; the relays end.
func (s *serializer) dropConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.Close()
	}
}

// Close stops accepting, drops every connection and waits for the relays.
func (s *serializer) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	s.closing = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
