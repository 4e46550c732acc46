//go:build !unix

package main

import (
	"os"
	"os/exec"
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
