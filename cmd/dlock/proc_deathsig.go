//go:build linux || freebsd

package main

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the system send COMMAND SIGKILL when run dies, so
// that a run killed by SIGKILL (or the OOM killer) does not leave COMMAND
// running without the lock. The signal reaches COMMAND alone, not the
// processes it started.
//
// On Linux the signal is sent when the thread that started COMMAND ends,
// not the process, and the Go runtime ends a thread whose locked goroutine
// exits: start COMMAND with startCommand, which keeps that thread until
// COMMAND has been reaped.
func dieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
