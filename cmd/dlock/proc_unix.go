//go:build unix

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// ownGroup makes cmd start in a process group of its own, as timeout(1)
// does, so that the signals run sends reach everything COMMAND started,
// and a Ctrl-C at the terminal reaches COMMAND once, through run.
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
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
