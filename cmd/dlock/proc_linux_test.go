package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tests of what Linux alone offers: the parent-death signal.

// A SIGKILL of dlock (or the OOM killer) takes COMMAND with it: the
// kernel sends COMMAND SIGKILL when dlock dies.
func TestRunKilledTakesCommandAlong(t *testing.T) {
	coll := collection(t)
	p := start(t, nil, runArgs(coll, "k", "--", "sh", "-c", `echo $$; exec sleep 60`)...)
	pid, err := strconv.Atoi(line(t, p.stdout, "COMMAND's pid"))
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() && alive(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	require.NoError(t, p.cmd.Process.Kill())
	deadline := time.Now().Add(watchdog)
	for alive(pid) {
		require.True(t, time.Now().Before(deadline), "COMMAND (pid %d) still running %v after dlock was killed", pid, watchdog)
		time.Sleep(10 * time.Millisecond)
	}
	p.wait(t)
}

// alive reports whether process pid runs: it exists and is not a zombie
// (a COMMAND orphaned by dlock's death is reaped by whichever process
// adopts it, which may be slow to).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// On Linux, COMMAND's parent-death signal is sent when the thread that
// started it ends. startCommand keeps COMMAND alive when the goroutine
// that calls it ends locked to its thread, which ends that thread.
func TestStartCommandOutlivesCallersThread(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	ownGroup(cmd)
	dieWithParent(cmd)
	type started struct {
		exited <-chan error
		err    error
		tid    int // the caller's thread, which ends with it
	}
	var s started
	for range 10 { // the main thread never ends: call from another one
		ch := make(chan started, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
			if syscall.Gettid() == syscall.Getpid() {
				ch <- started{}
				return
			}
			exited, err := startCommand(cmd)
			ch <- started{exited, err, syscall.Gettid()}
		}()
		if s = <-ch; s.tid != 0 {
			break
		}
	}
	require.NotZero(t, s.tid, "every call ran on the main thread")
	require.NoError(t, s.err)
	exited := s.exited // nil once received from
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if exited != nil {
			<-exited
		}
	}()

	task := fmt.Sprintf("/proc/self/task/%d", s.tid)
	deadline := time.Now().Add(watchdog)
	for _, err := os.Stat(task); err == nil; _, err = os.Stat(task) {
		require.True(t, time.Now().Before(deadline), "the caller's thread %d still running after %v", s.tid, watchdog)
		time.Sleep(time.Millisecond)
	}
	// The signal, if any, went as the thread ended; it kills at once.
	select {
	case err := <-exited:
		exited = nil
		t.Fatalf("COMMAND ended with the thread that started it: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	assert.True(t, alive(cmd.Process.Pid))
}
