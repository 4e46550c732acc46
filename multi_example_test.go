package dlock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/dlock-go/dlock"
)

// A transfer locks both accounts at once. Whatever order the callers name
// them in, every MultiMutex takes its keys in one order, so two transfers
// between the same accounts, in opposite directions, never wait for each
// other in a cycle.
func ExampleMultiMutex() {
	coll, done := exampleCollection("multi")
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := dlock.NewClient(coll)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	transfer := client.NewMultiMutex([]string{"account/bob", "account/alice"})
	if err := transfer.Lock(ctx); err != nil { // two commands when both are free
		log.Fatal(err)
	}
	hold := transfer.Lease()
	fmt.Println(hold.Keys())
	for _, key := range hold.Keys() {
		fmt.Println(key, "token", hold.Token(key)) // fence each account's writes with its own token
	}

	// Work under hold.Context(): it is cancelled if the hold of either
	// account is lost.
	_ = hold.Context()

	if err := transfer.Unlock(ctx); err != nil { // one command
		log.Fatal(err)
	}

	// TryLock takes all the keys or none.
	other := client.NewMutex("account/bob")
	if err := other.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(transfer.TryLock(ctx) != nil, transfer.Lease() == nil)
	if err := other.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// [account/alice account/bob]
	// account/alice token 1
	// account/bob token 1
	// true true
}

// move stands for the work a transfer does under its hold.
func move(ctx context.Context, from, to dlock.Token) error {
	fmt.Println("moving, fenced by", from, "and", to)
	return ctx.Err()
}

// The README's MultiMutex snippet.
func Example_readmeMultiMutex() {
	ctx := context.Background()
	client, done := readmeSetup("readme_multimutex")
	defer done()

	run := func() error {
		transfer := client.NewMultiMutex([]string{"account/bob", "account/alice"})
		if err := transfer.Lock(ctx); err != nil { // every key, or none
			return err
		}
		defer transfer.Unlock(ctx)
		hold := transfer.Lease() // Context and Lost: the hold of any key is lost
		return move(hold.Context(), hold.Token("account/alice"), hold.Token("account/bob"))
	}
	fmt.Println(run())
	// Output:
	// moving, fenced by 1 and 1
	// <nil>
}
