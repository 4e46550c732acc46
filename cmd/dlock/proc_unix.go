//go:build unix

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// The signals run catches, in three sets.
//
// stopSignals ask a process to end: the ones timeout(1) catches and
// passes on (it catches SIGALRM as well, as its own timer). While COMMAND
// runs, they are passed on to its process group, and run exits when
// COMMAND does; while run waits for KEY, they end the wait.
//
// passSignals mean something to COMMAND alone (a reload, a log reopened):
// they are passed on to COMMAND's group, and ignored while run waits for
// KEY. Uncaught, a Go program ignores them.
//
// quietSignals are caught and dropped. SIGPIPE is one, so that a write to
// a closed standard output or error fails with EPIPE instead of killing
// run while COMMAND runs. A caught signal is reset to its default action
// in COMMAND when it starts.
var (
	stopSignals  = []os.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM}
	passSignals  = []os.Signal{syscall.SIGUSR1, syscall.SIGUSR2}
	quietSignals = []os.Signal{syscall.SIGPIPE}
)

// ownGroup makes cmd start in a process group of its own, as timeout(1)
// does, so that the signals run sends reach everything COMMAND started,
// and a Ctrl-C at the terminal reaches COMMAND once, through run.
func ownGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// signalGroup sends sig to the process group of cmd, which has started.
// A group that has gone is no error.
func signalGroup(cmd *exec.Cmd, sig os.Signal) {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return
	}
	syscall.Kill(-cmd.Process.Pid, s)
}
