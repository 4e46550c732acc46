//go:build !linux && !freebsd

package main

import "os/exec"

// dieWithParent does nothing where the system cannot tie COMMAND's life
// to run's: a run killed by SIGKILL leaves COMMAND running.
func dieWithParent(*exec.Cmd) {}
