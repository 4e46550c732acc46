package dlocktest

import (
	"fmt"
	"sync"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/memhook"
)

// A Server is an in-memory lock store with the single-document semantics
// that dlock relies on in MongoDB (see the package documentation). It
// stands for one collection of lock documents: the Clients made by one
// Server share its keys; two Servers share nothing.
//
// A Server is safe for concurrent use. It starts no goroutine and needs no
// Close: it holds only memory. It remembers each Client it made, for
// Partition and Heal, for as long as the Server lives, so make a Server per
// test rather than one for a whole test binary.
//
// The zero value is an empty Server ready to use. A Server must not be
// copied after first use.
type Server struct {
	mu    sync.Mutex
	store any                   // guarded by mu: dlock's in-memory store; set once, by NewServer or the first NewClient
	links map[*dlock.Client]any // guarded by mu: each Client made here to its link; entries are added by NewClient and never removed
}

// NewServer returns a new, empty Server.
func NewServer() *Server {
	s := &Server{}
	s.init()
	return s
}

// init makes the store, unless made already; s.mu is held or s is not yet
// shared.
func (s *Server) init() {
	if s.store == nil {
		s.store = memhook.NewServer()
		s.links = map[*dlock.Client]any{}
	}
}

// NewClient returns a new Client on the Server with opts, as [dlock.NewClient]
// returns one on a collection: it starts the Client's background goroutine,
// which the Client's Close stops. It returns an error matching
// [dlock.ErrInvalidOption] for an invalid option (a nil one included).
//
// Inside a testing/synctest bubble, call it inside the bubble, so that the
// Client's goroutine belongs to the bubble.
func (s *Server) NewClient(opts ...dlock.Option) (*dlock.Client, error) {
	s.mu.Lock()
	s.init()
	store := s.store
	s.mu.Unlock()

	args := make([]any, len(opts))
	for i, o := range opts {
		args[i] = o
	}
	c, link, err := memhook.NewClient(store, args)
	if err != nil {
		return nil, err
	}
	client := c.(*dlock.Client)
	s.mu.Lock()
	s.links[client] = link
	s.mu.Unlock()
	return client, nil
}

// Client is like [Server.NewClient] but panics, with a message that starts
// with "dlocktest:", when an option is invalid: in a test, an invalid option
// is a mistake in the test, as an invalid pattern given to
// regexp.MustCompile is a mistake in the program. Close the Client as
// usual: its goroutine runs until then.
func (s *Server) Client(opts ...dlock.Option) *dlock.Client {
	c, err := s.NewClient(opts...)
	if err != nil {
		panic(fmt.Sprintf("dlocktest: Server.Client: %v", err))
	}
	return c
}

// Partition cuts c off from the Server, as a network fault would, until
// [Server.Heal]: every request c sends after Partition returns fails at once
// with a transient "server unreachable" error, and none is applied. A
// request already under way completes. So c's Lock keeps retrying until its
// ctx ends, its TryLock fails with that error (not [dlock.ErrLocked]: it
// cannot tell), and its leases are lost at their local deadlines. Close of
// a partitioned Client still stops its goroutines, but returns the error if
// it had leases to give back (their keys are free a TTL later).
//
// Partitioning a partitioned Client, or a closed one, is allowed. Partition
// panics when c is nil or was not made by this Server: the test is wrong,
// and a fault that silently did nothing would hide it.
func (s *Server) Partition(c *dlock.Client) {
	memhook.SetPartitioned(s.link("Partition", c), true)
}

// Heal ends c's partition: the requests c sends after Heal returns reach
// the Server again. A lease already lost stays lost. Healing a Client that
// is not partitioned does nothing. Heal panics, as [Server.Partition] does,
// when c is nil or was not made by this Server.
func (s *Server) Heal(c *dlock.Client) {
	memhook.SetPartitioned(s.link("Heal", c), false)
}

// link returns c's link, or panics naming method.
func (s *Server) link(method string, c *dlock.Client) any {
	if c == nil {
		panic(fmt.Sprintf("dlocktest: Server.%s of a nil Client", method))
	}
	s.mu.Lock()
	link, ok := s.links[c]
	s.mu.Unlock()
	if !ok {
		panic(fmt.Sprintf("dlocktest: Server.%s of a Client that this Server did not make (owner %q)", method, c.Owner()))
	}
	return link
}
