package dlock

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/goleak"
)

// The server every test uses: MONGODB_URI when set, otherwise the embedded
// FerretDB of tools/mongoserver, built and started here.
var (
	testURI    string
	testClient *mongo.Client
	testDB     *mongo.Database
	commands   commandLog
)

// commandLog counts the commands the test client sends, by name.
type commandLog struct {
	mu     sync.Mutex
	counts map[string]int
	total  atomic.Int64
	last   []event.CommandStartedEvent
}

func (l *commandLog) started(_ context.Context, e *event.CommandStartedEvent) {
	l.total.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.counts == nil {
		l.counts = map[string]int{}
	}
	l.counts[e.CommandName]++
	l.last = append(l.last, *e)
	if len(l.last) > 64 {
		l.last = l.last[1:]
	}
}

// forgetLast drops the recent commands kept for inspection: big bulk
// writes among them would count as live heap.
func (l *commandLog) forgetLast() {
	l.mu.Lock()
	l.last = nil
	l.mu.Unlock()
}

// since returns the number of commands sent since a reading of total.
func (l *commandLog) since(mark int64) int64 { return l.total.Load() - mark }

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dlock tests:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	testURI = os.Getenv("MONGODB_URI")
	if testURI == "" {
		uri, stop, err := startServer()
		if err != nil {
			return 0, err
		}
		defer stop()
		testURI = uri
	}
	os.Setenv("MONGODB_URI", testURI) // the examples read it, as a program would
	var err error
	testClient, err = mongo.Connect(options.Client().ApplyURI(testURI).
		SetMonitor(&event.CommandMonitor{Started: commands.started}))
	if err != nil {
		return 0, err
	}
	testDB = testClient.Database(fmt.Sprintf("dlocktest_%d", time.Now().UnixNano()))
	code := m.Run()
	testDB.Drop(context.Background())
	testClient.Disconnect(context.Background())
	if code == 0 {
		if err := goleak.Find(); err != nil {
			return 1, fmt.Errorf("leaked goroutines: %w", err)
		}
	}
	return code, nil
}

// startServer builds tools/mongoserver and runs it on a free port with its
// data in a temporary directory.
func startServer() (uri string, stop func(), err error) {
	_, here, _, _ := runtime.Caller(0)
	tools := filepath.Join(filepath.Dir(here), "tools")
	dir, err := os.MkdirTemp("", "dlocktest-")
	if err != nil {
		return "", nil, err
	}
	bin := filepath.Join(dir, "mongoserver")
	build := exec.Command("go", "build", "-o", bin, "./mongoserver")
	build.Dir, build.Stdout, build.Stderr = tools, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", nil, fmt.Errorf("build test server: %w", err)
	}
	args := []string{"-dir", filepath.Join(dir, "data"), "-exit-on-stdin-eof"}
	if pg := os.Getenv("DLOCK_TEST_POSTGRESQL"); pg != "" {
		args = append(args, "-postgresql", pg)
	}
	cmd := exec.Command(bin, args...)
	stdin, _ := cmd.StdinPipe() // with -exit-on-stdin-eof, the server exits when this closes
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() {
		stdin.Close()
		cmd.Wait()
		os.RemoveAll(dir)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "uri=") {
		stop()
		return "", nil, fmt.Errorf("test server did not start: %q %v", line, err)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, "uri=")), stop, nil
}

// newColl returns a fresh collection for one test.
func newColl(t testing.TB) *mongo.Collection {
	t.Helper()
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return testDB.Collection(fmt.Sprintf("%s_%d", name, time.Now().UnixNano()))
}

// newClient returns a Client on coll, closed when the test ends.
func newClient(t testing.TB, coll *mongo.Collection, opts ...Option) *Client {
	t.Helper()
	c, err := NewClient(coll, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}
