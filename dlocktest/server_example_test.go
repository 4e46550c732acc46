package dlocktest_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
)

// Two Clients of one Server, as two processes would have; A is cut off
// while it holds the key, in real time with a TTL of 100ms: A's lease is
// lost just under a TTL after its last write, and B takes the key a TTL
// after that write, with the next token.
func ExampleServer() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv := dlocktest.NewServer()
	a := srv.Client(dlock.WithTTL(100 * time.Millisecond))
	defer a.Close(ctx)
	b := srv.Client(dlock.WithTTL(100 * time.Millisecond))
	defer b.Close(ctx)

	ma, mb := a.NewMutex("report"), b.NewMutex("report")
	if err := ma.Lock(ctx); err != nil {
		fmt.Println(err)
		return
	}
	lease := ma.Lease()
	fmt.Println("A: token", lease.Token())
	if err := mb.TryLock(ctx); errors.Is(err, dlock.ErrLocked) {
		fmt.Println("B: locked")
	}

	srv.Partition(a) // A's extensions fail from now on
	select {
	case <-lease.Lost(): // just under a TTL after A's last write
	case <-ctx.Done():
	}
	fmt.Println("A lost:", errors.Is(lease.Err(), dlock.ErrLeaseLost))
	if err := mb.Lock(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("B acquired token", mb.Lease().Token())
	srv.Heal(a)
	// Output:
	// A: token 1
	// B: locked
	// A lost: true
	// B acquired token 2
}

// Servers share nothing, so tests may run in parallel, each on a Server of
// its own: the same key is held on both at once, each with token 1.
func ExampleNewServer() {
	ctx := context.Background()
	for _, name := range []string{"first", "second"} {
		srv := dlocktest.NewServer()
		c := srv.Client()
		defer c.Close(ctx)
		m := c.NewMutex("report")
		if err := m.TryLock(ctx); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(name, "server: token", m.Lease().Token())
	}
	// Output:
	// first server: token 1
	// second server: token 1
}

// A Client made with an invalid option: NewClient returns the error, where
// Client would panic.
func ExampleServer_NewClient() {
	_, err := dlocktest.NewServer().NewClient(dlock.WithTTL(0))
	fmt.Println(errors.Is(err, dlock.ErrInvalidOption))
	// Output:
	// true
}
