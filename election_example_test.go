package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dlock-go/dlock"
)

func ExampleElection() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("election")
	defer disconnect()
	client, err := dlock.NewClient(coll)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	e := client.NewElection("scheduler", dlock.WithObserveInterval(10*time.Millisecond))
	observing, stop := context.WithCancel(ctx)
	defer stop()
	changes := e.Observe(observing) // nobody leads yet: a Leader with no Owner
	fmt.Printf("observed leader %q\n", (<-changes).Value)

	// Campaign blocks until this Client leads; the term is a Lease.
	term, err := e.Campaign(ctx, "host-a:8080")
	if err != nil {
		log.Fatal(err)
	}
	// Run the leader's work under term.Context(): it is cancelled if
	// leadership is lost. Fence its writes with term.Token().
	leader, err := e.Leader(ctx) // what any process sees
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leader", leader.Value, "term", leader.Token, "is us:", leader.Owner == client.Owner())
	fmt.Printf("observed leader %q\n", (<-changes).Value)

	// A new value, the same term.
	if err := e.Proclaim(ctx, "host-a:9090"); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("observed leader %q\n", (<-changes).Value)

	// Resign.
	if err := term.Release(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = e.Leader(ctx)
	fmt.Println(errors.Is(err, dlock.ErrNoLeader))
	fmt.Println(errors.Is(e.Proclaim(ctx, "host-a:1"), dlock.ErrNotHeld))
	// Output:
	// observed leader ""
	// leader host-a:8080 term 1 is us: true
	// observed leader "host-a:8080"
	// observed leader "host-a:9090"
	// true
	// true
}
