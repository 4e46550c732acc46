package stress

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The checker has teeth: histories with an overlap of holders, a lost
// update, a stale write admitted, or a takeover before the old holder saw
// its loss are each reported.
func TestCheckerCatchesViolations(t *testing.T) {
	rw := func(p, id int, tok uint64, t0 int64, read int64, res string) []event {
		return []event{
			{P: p, Op: opValid, Key: "k", Tok: tok, T: t0},
			{P: p, Op: opReadCall, Key: "k", Tok: tok, ID: id, T: t0 + 1},
			{P: p, Op: opReadRet, ID: id, V: read, T: t0 + 2},
			{P: p, Op: opWriteCall, Key: "k", Tok: tok, ID: id + 1, V: read + 1, T: t0 + 3},
			{P: p, Op: opWriteRet, ID: id + 1, Res: res, T: t0 + 4},
		}
	}
	check := func(final int64, events ...[]event) report {
		var all []event
		for _, e := range events {
			all = append(all, e...)
		}
		var r report
		checkExclusion(all, &r)
		checkRegisters(all, map[string]int64{"k": final}, 1000, &r)
		return r
	}
	assert.Empty(t, check(2, rw(1, 10, 1, 0, 0, resOK), rw(2, 20, 2, 10, 1, resOK)).violations, "a correct history")
	assert.NotEmpty(t, check(1, rw(1, 10, 1, 0, 0, resOK), rw(2, 20, 2, 1, 0, resOK)).violations, "overlapping holders, lost update")
	assert.NotEmpty(t, check(1, rw(2, 20, 2, 0, 0, resOK), rw(1, 10, 1, 10, 1, resOK)).violations, "older token admitted after a newer one")
	assert.NotEmpty(t, check(5, rw(1, 10, 1, 0, 0, resOK)).violations, "final value unaccounted for")

	takeover := func(lost, next int64, more ...event) report {
		var r report
		checkTakeovers(append([]event{
			{P: 1, Op: opAcquired, Key: "k", Tok: 1, T: 0},
			{P: 1, Op: opLost, Key: "k", Tok: 1, T: lost},
			{P: 2, Op: opAcquired, Key: "k", Tok: 2, T: next},
		}, more...), &r)
		return r
	}
	r := takeover(10, 15)
	assert.Empty(t, r.violations, "lost, then taken over")
	assert.Equal(t, []time.Duration{5}, r.margins)
	assert.NotEmpty(t, takeover(10, 5).violations, "taken over before the holder saw its loss")
	assert.Empty(t, takeover(10, 5, event{P: 1, Op: opRelease, Key: "k", Tok: 1, T: 3}).violations, "released, then its lease ran out")
}
