// Command demo shows dlock at work: workers, each with its own Client (as
// separate processes would have), contend for one key and write to a shared
// register through fenced writes; then one worker freezes past its lease,
// another takes over, and the frozen one's late write is rejected by the
// fence. It runs against MONGODB_URI when set, else an embedded server.
// With -trace it prints dlock's OpenTelemetry spans as they end.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tools/testserver"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

const key = "nightly-report"

func main() {
	traces := flag.Bool("trace", false, "print dlock's spans (one line each) as they end")
	flag.Parse()
	ctx := context.Background()
	if *traces {
		defer traceToStdout()(ctx)
	}
	uri := os.Getenv("MONGODB_URI")
	if uri == "" {
		dir, err := os.MkdirTemp("", "dlock-demo-")
		check(err)
		defer os.RemoveAll(dir)
		srv, err := testserver.Start(testserver.Config{Dir: dir})
		check(err)
		defer srv.Close()
		uri = srv.URI()
		fmt.Println("embedded server (FerretDB, serialized) at", uri)
	}
	db := connect(uri).Database(fmt.Sprintf("dlock_demo_%d", time.Now().Unix()))
	defer db.Drop(ctx)
	locks, data := db.Collection("locks"), db.Collection("data")
	_, err := data.InsertOne(ctx, bson.D{{Key: "_id", Value: "register"}, {Key: "writes", Value: bson.A{}}})
	check(err)

	fmt.Println("\n1. three workers contend for", key)
	var wg sync.WaitGroup
	for i := 1; i <= 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("worker-%d", i)
			c, err := dlock.NewClient(locks, dlock.WithTTL(2*time.Second))
			check(err)
			defer c.Close(ctx)
			mu := c.NewMutex(key)
			for range 2 {
				check(mu.Lock(ctx))
				t := mu.Lease().Token()
				fmt.Printf("   %s holds %s with token %d\n", name, key, t)
				write(ctx, data, name, t)
				time.Sleep(50 * time.Millisecond) // the protected work
				check(mu.Unlock(ctx))
			}
		}()
	}
	wg.Wait()

	fmt.Println("\n2. worker-4 freezes past its lease; worker-5 takes over")
	relay := newRelay(uri)
	defer relay.Close()
	frozen, err := dlock.NewClient(connect(relay.URI()).Database(db.Name()).Collection("locks"),
		dlock.WithTTL(time.Second))
	check(err)
	defer frozen.Close(ctx)
	mu4 := frozen.NewMutex(key)
	check(mu4.Lock(ctx))
	old := mu4.Lease().Token()
	fmt.Printf("   worker-4 holds %s with token %d, then freezes\n", key, old)
	relay.Freeze() // nothing it sends arrives: no extension, no release

	c5, err := dlock.NewClient(locks)
	check(err)
	defer c5.Close(ctx)
	mu5 := c5.NewMutex(key)
	start := time.Now()
	check(mu5.Lock(ctx))
	fmt.Printf("   worker-5 holds %s with token %d after waiting %v\n", key, mu5.Lease().Token(), time.Since(start).Round(10*time.Millisecond))
	write(ctx, data, "worker-5", mu5.Lease().Token())

	fmt.Printf("   worker-4 wakes, unaware, and writes with its old token %d:\n", old)
	write(ctx, data, "worker-4", old)
	check(mu5.Unlock(ctx))

	var reg struct{ Writes []string }
	check(data.FindOne(ctx, bson.D{{Key: "_id", Value: "register"}}).Decode(&reg))
	fmt.Println("\nregister, in order of accepted writes:", reg.Writes)
}

// write appends name to the register, fenced by token t.
func write(ctx context.Context, data *mongo.Collection, name string, t dlock.Token) {
	_, err := dlock.UpdateFenced(ctx, data, bson.D{{Key: "_id", Value: "register"}},
		bson.D{{Key: "$push", Value: bson.D{{Key: "writes", Value: fmt.Sprintf("%s#%d", name, t)}}}}, t)
	switch {
	case errors.Is(err, dlock.ErrStaleToken):
		fmt.Printf("   rejected by the fence: %v\n", err)
	case err != nil:
		log.Fatal(err)
	}
}

func connect(uri string) *mongo.Client {
	c, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(2 * time.Second))
	check(err)
	return c
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// relay forwards TCP to the server until frozen; then it forwards nothing,
// as if the process on its far side had stopped.
type relay struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	frozen bool
	conns  []net.Conn
}

func newRelay(uri string) *relay {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	u, err := url.Parse(uri)
	check(err)
	r := &relay{ln: ln, target: u.Host}
	go r.accept()
	return r
}

func (r *relay) URI() string { return "mongodb://" + r.ln.Addr().String() + "/" }

func (r *relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", r.target)
		r.mu.Lock()
		if err != nil || r.frozen {
			r.mu.Unlock()
			c.Close()
			continue
		}
		r.conns = append(r.conns, c, s)
		r.mu.Unlock()
		go io.Copy(s, c)
		go io.Copy(c, s)
	}
}

func (r *relay) Freeze() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.frozen = true
	for _, c := range r.conns {
		c.Close()
	}
}

func (r *relay) Close() { r.ln.Close(); r.Freeze() }
