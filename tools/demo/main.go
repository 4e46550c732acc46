// Command demo shows dlock at work: workers, each with its own Client (as
// separate processes would have), contend for one key and write to a shared
// register through fenced writes; each says how long its Lock waited and
// who held the key before it. Then one worker stalls past its lease, another
// takes over, and the stalled one wakes to find its lease lost and its late
// write rejected by the fence. It runs against MONGODB_URI when set, else an
// embedded server. With -trace it also prints dlock's OpenTelemetry spans
// as they end.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tools/testserver"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

const key = "nightly-report"

// clientOpts are given to every Client the demo makes: with -trace, a
// tracer provider of dlock's own, so that the embedded server's spans (it
// uses the global provider) stay out of the output.
var clientOpts []dlock.Option

func main() {
	traces := flag.Bool("trace", false, "print dlock's spans (one line each) as they end")
	flag.Parse()
	ctx := context.Background()
	if *traces {
		tp, shutdown := traceToStdout()
		defer shutdown(ctx)
		clientOpts = append(clientOpts, dlock.WithTracerProvider(tp))
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

	fmt.Println("\n1. three workers contend for", key, "(each holds it twice, for 50ms)")
	var wg sync.WaitGroup
	for i := 1; i <= 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("worker-%d", i)
			c := newClient(name, locks, dlock.WithTTL(2*time.Second))
			defer c.Close(ctx)
			mu := c.NewMutex(key)
			for range 2 {
				start := time.Now()
				check(mu.Lock(ctx))
				waited := time.Since(start)
				t := mu.Lease().Token()
				prev := lastWrite(ctx, data)
				check(write(ctx, data, name, t))
				fmt.Printf("   %s holds token %d, after waiting %v %s\n", name, t, round(waited), after(prev))
				time.Sleep(50 * time.Millisecond) // the protected work
				check(mu.Unlock(ctx))
				time.Sleep(20 * time.Millisecond) // other work, not under the lock
			}
		}()
	}
	wg.Wait()

	fmt.Println("\n2. worker-4 stalls past its lease; worker-5 takes over once worker-4 is silent for a TTL")
	relay := newRelay(uri)
	defer relay.Close()
	stalled := newClient("worker-4", connect(relay.URI()).Database(db.Name()).Collection("locks"), dlock.WithTTL(time.Second))
	defer stalled.Close(ctx)
	mu4 := stalled.NewMutex(key)
	check(mu4.Lock(ctx))
	lease4 := mu4.Lease()
	ended := make(chan time.Time, 1) // when lease4 ended, as worker-4's Client saw it
	go func() { <-lease4.Done(); ended <- time.Now() }()
	check(write(ctx, data, "worker-4", lease4.Token()))
	fmt.Printf("   worker-4 holds token %d (TTL 1s), then stalls: nothing it sends reaches the server\n", lease4.Token())
	relay.Freeze() // no extension, no release gets through

	c5 := newClient("worker-5", locks)
	defer c5.Close(ctx)
	mu5 := c5.NewMutex(key)
	start := time.Now()
	check(mu5.Lock(ctx))
	took := time.Now()
	prev := lastWrite(ctx, data)
	check(write(ctx, data, "worker-5", mu5.Lease().Token()))
	fmt.Printf("   worker-5 holds token %d, after waiting %v %s\n", mu5.Lease().Token(), round(time.Since(start)), after(prev))

	// worker-4 wakes. A careful worker checks its lease before each write;
	// this one had a write under way when it stalled.
	select {
	case <-lease4.Lost():
		fmt.Printf("   worker-4 wakes: lease lost (token %d); Lost() closed %v before worker-5 took over. Err():\n",
			lease4.Token(), round(took.Sub(<-ended)))
		fmt.Printf("      %v\n", lease4.Err())
	default:
		fmt.Println("   worker-4 wakes: its lease is still valid (unexpected)")
	}
	err = write(ctx, data, "worker-4", lease4.Token())
	fmt.Printf("   worker-4's late write with token %d: %v\n", lease4.Token(), verdict(err))
	check(mu5.Unlock(ctx))

	var reg struct{ Writes []string }
	check(data.FindOne(ctx, bson.D{{Key: "_id", Value: "register"}}).Decode(&reg))
	fmt.Println("\nregister, in order of accepted writes:", strings.Join(reg.Writes, " "))
}

// newClient returns a Client for the worker name. Its owner identity starts
// with the name, for the spans, and ends with 128 random bits: an identity
// must be unique to one live Client and hard to guess.
func newClient(name string, coll *mongo.Collection, opts ...dlock.Option) *dlock.Client {
	var b [16]byte
	rand.Read(b[:])
	opts = append(opts, dlock.WithOwner(fmt.Sprintf("%s-%x", name, b)))
	c, err := dlock.NewClient(coll, append(opts, clientOpts...)...)
	check(err)
	return c
}

// write appends name#t to the register, fenced by token t. It returns the
// fence's refusal, a [*dlock.StaleTokenError]; other errors end the demo.
func write(ctx context.Context, data *mongo.Collection, name string, t dlock.Token) error {
	_, err := dlock.UpdateFenced(ctx, data, bson.D{{Key: "_id", Value: "register"}},
		bson.D{{Key: "$push", Value: bson.D{{Key: "writes", Value: fmt.Sprintf("%s#%d", name, t)}}}}, t)
	if err != nil && !errors.Is(err, dlock.ErrStaleToken) {
		log.Fatal(err)
	}
	return err
}

// lastWrite returns the register's last accepted write ("worker-2#3"): the
// previous holder's, when read under the lock.
func lastWrite(ctx context.Context, data *mongo.Collection) string {
	var reg struct{ Writes []string }
	check(data.FindOne(ctx, bson.D{{Key: "_id", Value: "register"}}).Decode(&reg))
	if len(reg.Writes) == 0 {
		return ""
	}
	return reg.Writes[len(reg.Writes)-1]
}

// after says who held the key before, from the register's last write.
func after(prev string) string {
	name, token, ok := strings.Cut(prev, "#")
	if !ok {
		return "(first holder)"
	}
	return fmt.Sprintf("(held before by %s, token %s)", name, token)
}

func verdict(err error) string {
	if err != nil {
		return "rejected by the fence: " + err.Error()
	}
	return "accepted (unexpected)"
}

func round(d time.Duration) time.Duration {
	if d < 10*time.Millisecond {
		return d.Round(time.Millisecond)
	}
	return d.Round(10 * time.Millisecond)
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
