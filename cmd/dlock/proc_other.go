//go:build !unix

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// The signals run catches: see proc_unix.go. Where there are no Unix
// signals, the system delivers only these two (Ctrl-C, and a console
// closed or the system shut down).
var (
	stopSignals  = []os.Signal{os.Interrupt, syscall.SIGTERM}
	passSignals  []os.Signal
	quietSignals []os.Signal
)

// ownGroup does nothing where there are no process groups.
func ownGroup(*exec.Cmd) {}

// signalGroup sends sig to COMMAND alone; where the system cannot send
// it (Windows has only kill), COMMAND is killed.
func signalGroup(cmd *exec.Cmd, sig os.Signal) {
	if cmd.Process.Signal(sig) != nil {
		cmd.Process.Kill()
	}
}
