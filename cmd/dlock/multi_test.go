package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dlock run with several keys takes them all, in sorted order, names each
// key and token in COMMAND's environment, shows each key held to dlock
// status, and keeps a run on any of them out; all are free once it exits.
func TestRunSeveralKeys(t *testing.T) {
	coll := collection(t)
	p := start(t, nil, runArgs(coll, "-v", "b", "a", "b", "--",
		"sh", "-c", `echo "$DLOCK_KEY_1|$DLOCK_TOKEN_1|$DLOCK_KEY_2|$DLOCK_TOKEN_2|$DLOCK_KEY_3|$DLOCK_KEY"; read line`)...)
	assert.Equal(t, "a|1|b|1||", line(t, p.stdout, "COMMAND's environment"), "sorted, without duplicates")
	for _, k := range []string{"a", "b"} {
		status, stdout, stderr := dlockRun(t, nil, statusArgs(coll, k)...)
		require.Equal(t, 0, status, "stderr: %q", stderr)
		require.Len(t, stdout, 1)
		assert.True(t, strings.HasPrefix(stdout[0], "token 1 exclusive owner "), "%q: %q", k, stdout)
	}
	ran := filepath.Join(t.TempDir(), "ran")
	status, _, stderr := dlockRun(t, nil, runArgs(coll, "-try", "c", "b", "--", "touch", ran)...)
	assert.Equal(t, exitHeld, status, "stderr: %q", stderr)
	assert.NoFileExists(t, ran)
	status, _, stderr = dlockRun(t, nil, runArgs(coll, "-try", "c", "--", "true")...)
	assert.Equal(t, 0, status, "c was left free: stderr %q", stderr)

	fmt.Fprintln(p.stdin, "done")
	status, _, stderr = p.wait(t)
	require.Equal(t, 0, status, "stderr: %q", stderr)
	assert.Contains(t, strings.Join(stderr, "\n"), `holding "b a b" with tokens [1 1]`)
	status, _, stderr = dlockRun(t, nil, runArgs(coll, "-try", "a", "b", "c", "--", "true")...)
	assert.Equal(t, 0, status, "all free again: stderr %q", stderr)
}
