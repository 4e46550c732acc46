package stress

import (
	"bufio"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/dlock-go/dlock/tools/testserver"
	"github.com/stretchr/testify/require"
)

// The test server in a process of its own, so that a test can kill it
// (SIGKILL) and start it again on the same data and address.
const (
	envServerDir  = "DLOCK_STRESS_SERVER_DIR"
	envServerAddr = "DLOCK_STRESS_SERVER_ADDR"
)

type serverProc struct {
	t         *testing.T
	dir, addr string
	uri       string
	cmd       *exec.Cmd
	stdin     io.Closer
}

// startServerProc starts the server process, stopped when the test ends.
func startServerProc(t *testing.T) *serverProc {
	s := &serverProc{t: t, dir: t.TempDir(), addr: "127.0.0.1:0"}
	s.start()
	u, err := url.Parse(s.uri)
	require.NoError(t, err)
	s.addr = u.Host // the same port for every restart
	t.Cleanup(func() {
		s.stdin.Close()
		s.cmd.Wait()
	})
	return s
}

// start starts the server process and waits until it accepts connections.
func (s *serverProc) start() {
	cmd := command(s.t, "server", "", nil, envServerDir+"="+s.dir, envServerAddr+"="+s.addr)
	stdin, err := cmd.StdinPipe()
	require.NoError(s.t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(s.t, err)
	require.NoError(s.t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(s.t, err, "server process")
	uri, ok := strings.CutPrefix(strings.TrimSpace(line), "uri=")
	require.True(s.t, ok, "server process said %q", line)
	s.cmd, s.stdin, s.uri = cmd, stdin, uri
}

// kill kills the server process, as a crash would.
func (s *serverProc) kill() {
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.cmd.Wait()
}

// runServer is the server process: it serves until its standard input
// closes.
func runServer() error {
	srv, err := testserver.Start(testserver.Config{Dir: os.Getenv(envServerDir), Addr: os.Getenv(envServerAddr)})
	if err != nil {
		return err
	}
	fmt.Printf("uri=%s\n", srv.URI())
	io.Copy(io.Discard, os.Stdin)
	return srv.Close()
}
