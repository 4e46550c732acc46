package stress

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The checker has teeth: histories with an overlap of holders, a lost
// update, a stale write admitted, a final value unaccounted for, a
// takeover before the old holder saw its loss, or a takeover it never saw
// are each reported; histories that only look alike (writes of unknown
// outcome, applied or not; a holder frozen or killed) are not.
func TestCheckerCatchesViolations(t *testing.T) {
	t.Run("registers", testCheckerRegisters)
	t.Run("takeovers", testCheckerTakeovers)
	t.Run("shared", testCheckerShared)
}

func testCheckerShared(t *testing.T) {
	// valid is a hold of token tok on key, seen valid from first to last.
	valid := func(key string, tok uint64, shared bool, first, last int64) []event {
		return []event{{Op: opValid, Key: key, Tok: tok, Sh: shared, T: first}, {Op: opValid, Key: key, Tok: tok, Sh: shared, T: last}}
	}
	for _, tc := range []struct {
		name      string
		holds     [][]event
		violation bool
	}{
		{"readers overlap", [][]event{valid(rwKey, 1, true, 0, 10), valid(rwKey, 2, true, 5, 15)}, false},
		{"a writer beside an older reader", [][]event{valid(rwKey, 1, true, 0, 10), valid(rwKey, 2, false, 5, 15)}, true},
		{"a reader beside an older writer", [][]event{valid(rwKey, 1, false, 0, 10), valid(rwKey, 2, true, 5, 15)}, true},
		{"a writer beside a reader, not adjacent in tokens", [][]event{valid(rwKey, 1, true, 0, 20), valid(rwKey, 2, true, 5, 6), valid(rwKey, 3, false, 15, 25)}, true},
		{"reader, then writer, then reader", [][]event{valid(rwKey, 1, true, 0, 10), valid(rwKey, 2, false, 11, 20), valid(rwKey, 3, true, 21, 30)}, false},
		{"two permits at once", [][]event{valid(semKey, 1, true, 0, 10), valid(semKey, 2, true, 5, 15)}, false},
		{"three permits at once", [][]event{valid(semKey, 1, true, 0, 10), valid(semKey, 2, true, 5, 15), valid(semKey, 3, true, 9, 20)}, true},
		{"three permits, two at a time", [][]event{valid(semKey, 1, true, 0, 10), valid(semKey, 2, true, 5, 15), valid(semKey, 3, true, 11, 20)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r report
			checkExclusion(slices.Concat(tc.holds...), &r)
			assert.Equal(t, tc.violation, len(r.violations) > 0, "violations: %q", r.violations)
		})
	}
}

func testCheckerRegisters(t *testing.T) {
	// rw is a hold of process p with token tok from t0: it reads the
	// register (read is the value read) and writes read+1, which res
	// reports ("" for a write that never returned: its process was killed).
	rw := func(p, id int, tok uint64, t0 int64, read int64, res string) []event {
		h := []event{
			{P: p, Op: opValid, Key: "k", Tok: tok, T: t0},
			{P: p, Op: opReadCall, Key: "k", Tok: tok, ID: id, T: t0 + 1},
			{P: p, Op: opReadRet, ID: id, V: read, Res: resOK, T: t0 + 2},
			{P: p, Op: opWriteCall, Key: "k", Tok: tok, ID: id + 1, V: read + 1, T: t0 + 3},
		}
		if res != "" {
			h = append(h, event{P: p, Op: opWriteRet, ID: id + 1, Res: res, T: t0 + 4})
		}
		return h
	}
	for _, tc := range []struct {
		name        string
		final       int64
		holds       [][]event
		violation   bool
		lostUpdates int
	}{
		{"a correct history", 2, [][]event{rw(1, 10, 1, 0, 0, resOK), rw(2, 20, 2, 10, 1, resOK)}, false, 0},
		{"overlapping holders, lost update", 1, [][]event{rw(1, 10, 1, 0, 0, resOK), rw(2, 20, 2, 1, 0, resOK)}, true, 1},
		{"older token admitted after a newer one", 1, [][]event{rw(2, 20, 2, 0, 0, resOK), rw(1, 10, 1, 10, 1, resOK)}, true, 0},
		{"final value unaccounted for", 5, [][]event{rw(1, 10, 1, 0, 0, resOK)}, true, 0},
		{"paused holder's write rejected", 1, [][]event{rw(1, 10, 1, 0, 0, "")[:3], rw(2, 20, 2, 10, 0, resOK), {
			{P: 1, Op: opWriteCall, Key: "k", Tok: 1, ID: 11, V: 1, T: 20},
			{P: 1, Op: opWriteRet, ID: 11, Res: resStale, T: 21},
		}}, false, 0},
		{"paused holder's write admitted", 1, [][]event{rw(1, 10, 1, 0, 0, "")[:3], rw(2, 20, 2, 10, 0, resOK), {
			{P: 1, Op: opWriteCall, Key: "k", Tok: 1, ID: 11, V: 1, T: 20},
			{P: 1, Op: opWriteRet, ID: 11, Res: resOK, T: 21},
		}}, true, 1},

		// A late write between the next holder's read and write: the
		// CI failure's history, with plain reads. A fenced read raised
		// the fence, so the late write must have been refused.
		{"late write admitted between a fenced read and its write", 1, [][]event{rw(1, 10, 1, 0, 0, "")[:3], rw(2, 20, 2, 10, 0, "")[:3], {
			{P: 1, Op: opWriteCall, Key: "k", Tok: 1, ID: 11, V: 1, T: 13},
			{P: 1, Op: opWriteRet, ID: 11, Res: resOK, T: 14},
			{P: 2, Op: opWriteCall, Key: "k", Tok: 2, ID: 21, V: 1, T: 15},
			{P: 2, Op: opWriteRet, ID: 21, Res: resOK, T: 16},
		}}, true, 1},
		{"late write refused between a fenced read and its write", 1, [][]event{rw(1, 10, 1, 0, 0, "")[:3], rw(2, 20, 2, 10, 0, "")[:3], {
			{P: 1, Op: opWriteCall, Key: "k", Tok: 1, ID: 11, V: 1, T: 13},
			{P: 1, Op: opWriteRet, ID: 11, Res: resStale, T: 14},
			{P: 2, Op: opWriteCall, Key: "k", Tok: 2, ID: 21, V: 1, T: 15},
			{P: 2, Op: opWriteRet, ID: 21, Res: resOK, T: 16},
		}}, false, 0},
		{"old holder's fenced read refused", 1, [][]event{rw(2, 20, 2, 0, 0, resOK), {
			{P: 1, Op: opReadCall, Key: "k", Tok: 1, ID: 11, T: 10},
			{P: 1, Op: opReadRet, ID: 11, Res: resStale, T: 11},
		}}, false, 0},
		{"new holder's fenced read refused", 0, [][]event{{
			{P: 1, Op: opReadCall, Key: "k", Tok: 1, ID: 11, T: 10},
			{P: 1, Op: opReadRet, ID: 11, Res: resStale, T: 11},
		}}, true, 0},
		{"old holder's fenced read admitted after a newer write", 1, [][]event{rw(2, 20, 2, 0, 0, resOK), rw(1, 10, 1, 10, 1, "")[:3]}, true, 0},
		{"fenced read of a killed process raised the fence", 0, [][]event{rw(1, 10, 1, 0, 0, "")[:3], rw(2, 20, 2, 10, 0, "")[:2], {
			{P: 1, Op: opWriteCall, Key: "k", Tok: 1, ID: 11, V: 1, T: 20},
			{P: 1, Op: opWriteRet, ID: 11, Res: resStale, T: 21},
		}}, false, 0},
		// A fenced read of unknown outcome (its context ended, say) may
		// have raised the fence, or not: both pass.
		{"unknown fenced read raised the fence", 0, [][]event{{
			{P: 2, Op: opReadCall, Key: "k", Tok: 2, ID: 21, T: 10},
			{P: 2, Op: opReadRet, ID: 21, Res: resUnknown, T: 11},
			{P: 1, Op: opWriteCall, Key: "k", Tok: 1, ID: 11, V: 1, T: 20},
			{P: 1, Op: opWriteRet, ID: 11, Res: resStale, T: 21},
		}}, false, 0},
		{"unknown fenced read did not raise the fence", 1, [][]event{{
			{P: 2, Op: opReadCall, Key: "k", Tok: 2, ID: 21, T: 10},
			{P: 2, Op: opReadRet, ID: 21, Res: resUnknown, T: 11},
			{P: 1, Op: opWriteCall, Key: "k", Tok: 1, ID: 11, V: 1, T: 20},
			{P: 1, Op: opWriteRet, ID: 11, Res: resOK, T: 21},
		}}, false, 0},
		{"reader's plain read beside an older token", 1, [][]event{rw(2, 20, 2, 0, 0, resOK), {
			{P: 1, Op: opReadCall, Key: "k", Tok: 1, ID: 11, Sh: true, T: 10},
			{P: 1, Op: opReadRet, ID: 11, V: 1, Res: resOK, T: 11},
		}}, false, 0},

		// Writes of unknown outcome: applied or not, and the final value
		// with or without them, all pass; a lost update among them does not.
		{"unknown write applied, then read", 2, [][]event{rw(1, 10, 1, 0, 0, resUnknown), rw(2, 20, 2, 10, 1, resOK)}, false, 0},
		{"unknown write not applied, then read", 1, [][]event{rw(1, 10, 1, 0, 0, resUnknown), rw(2, 20, 2, 10, 0, resOK)}, false, 0},
		{"unknown write last, final value includes it", 2, [][]event{rw(1, 10, 1, 0, 0, resOK), rw(2, 20, 2, 10, 1, resUnknown)}, false, 0},
		{"unknown write last, final value excludes it", 1, [][]event{rw(1, 10, 1, 0, 0, resOK), rw(2, 20, 2, 10, 1, resUnknown)}, false, 0},
		{"write never returned, final value includes it", 2, [][]event{rw(1, 10, 1, 0, 0, resOK), rw(2, 20, 2, 10, 1, "")}, false, 0},
		{"write never returned, final value excludes it", 1, [][]event{rw(1, 10, 1, 0, 0, resOK), rw(2, 20, 2, 10, 1, "")}, false, 0},
		{"lost update after an unknown write", 1, [][]event{rw(1, 10, 1, 0, 0, resUnknown), rw(2, 20, 2, 10, 0, resOK), rw(3, 30, 3, 20, 0, resOK)}, true, 1},
		{"unknown write applied, then lost", 2, [][]event{rw(1, 10, 1, 0, 0, resUnknown), rw(2, 20, 2, 10, 1, resOK), rw(3, 30, 3, 20, 1, resOK)}, true, 1},
		{"final value below the admitted writes, unknown ones aside", 0, [][]event{rw(1, 10, 1, 0, 0, resUnknown), rw(2, 20, 2, 10, 0, resOK)}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var all []event
			for _, h := range tc.holds {
				all = append(all, h...)
			}
			var r report
			checkExclusion(all, &r)
			checkRegisters(all, map[string]int64{"k": tc.final}, 1000, &r)
			assert.Equal(t, tc.violation, len(r.violations) > 0, "violations: %q", r.violations)
			assert.Equal(t, tc.lostUpdates, r.lostUpdates, "lost updates")
		})
	}
}

func testCheckerTakeovers(t *testing.T) {
	// Process 1 calls Lock at 0 and holds token 1 from acquired; process
	// 2 acquires token 2 at 1000 (a TTL, in these histories, is 1000).
	// more adds the rest of the story.
	history := func(acquired int64, more ...event) []event {
		return append([]event{
			{P: 1, Op: opLockCall, Key: "k", T: 0},
			{P: 1, Op: opAcquired, Key: "k", Tok: 1, T: acquired},
			{P: 2, Op: opLockCall, Key: "k", T: 5},
			{P: 2, Op: opAcquired, Key: "k", Tok: 2, T: 1000},
		}, more...)
	}
	lost := func(at int64) event { return event{P: 1, Op: opLost, Key: "k", Tok: 1, T: at} }
	released := func(at int64) event { return event{P: 1, Op: opRelease, Key: "k", Tok: 1, T: at} }
	frozen := func(from, to int64) []event {
		return []event{{P: 1, Op: opFault, Res: faultFreeze, T: from}, {P: 1, Op: opThawed, T: to}}
	}
	killed := func(at int64) event { return event{P: 1, Op: opFault, Res: faultKill, T: at} }

	for _, tc := range []struct {
		name      string
		events    []event
		violation bool
		margins   []time.Duration
	}{
		{"lost, then taken over", history(10, lost(990)), false, []time.Duration{10}},
		{"taken over before the holder saw its loss", history(10, lost(1005)), true, nil},
		{"released, then its lease ran out", history(10, released(20), lost(1005)), false, nil},
		{"frozen while holding, loss seen after the thaw", history(10, append(frozen(20, 1520), lost(1521))...), false, nil},
		// The sigstop flake: frozen after the acquire was sent, before
		// acquired was logged; acquired, release and lost follow the thaw.
		{"frozen during Lock, loss seen after the thaw", append(frozen(2, 1502), history(1503, released(1504), lost(1505))...), false, nil},
		{"the same, not frozen", history(1503, released(1504), lost(1505)), true, nil},
		{"frozen before the Lock call", append(frozen(-1600, -100), history(1503, released(1504), lost(1505))...), true, nil},
		{"thawed just before the takeover, loss seen just after it", history(10, append(frozen(20, 995), lost(1002))...), false, nil},
		{"frozen after the takeover, loss seen after the thaw", history(10, append(frozen(1005, 2505), lost(2506))...), true, nil},
		{"frozen after the loss, then taken over", history(10, append(frozen(995, 2495), lost(990))...), false, nil},

		{"taken over with no loss seen", history(10), true, nil},
		{"released after the takeover, no loss seen", history(10, released(1005)), true, nil},
		{"killed while holding", history(10, killed(500)), false, nil},
		{"a token handed out twice", []event{
			{P: 1, Op: opAcquired, Key: "j", Tok: 5, T: 0}, {P: 1, Op: opRelease, Key: "j", Tok: 5, T: 10},
			{P: 2, Op: opAcquired, Key: "j", Tok: 5, T: 20}, {P: 2, Op: opRelease, Key: "j", Tok: 5, T: 30},
		}, true, nil},
		{"killed after the takeover, no loss seen", history(10, killed(1005)), true, nil},
		{"frozen over the takeover, no loss seen", history(10, frozen(500, 2000)...), false, nil},
		{"frozen after the takeover, no loss seen", history(10, frozen(1005, 2505)...), true, nil},
		{"last hold of the run", []event{{P: 1, Op: opLockCall, Key: "k", T: 0}, {P: 1, Op: opAcquired, Key: "k", Tok: 1, T: 10}}, false, nil},
		{"next hold by the same process", []event{
			{P: 1, Op: opAcquired, Key: "k", Tok: 1, T: 10},
			{P: 1, Op: opAcquired, Key: "k", Tok: 2, T: 1000},
		}, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r report
			checkTakeovers(tc.events, &r)
			assert.Equal(t, tc.violation, len(r.violations) > 0, "violations: %q", r.violations)
			assert.Equal(t, tc.margins, r.margins, "margins")
		})
	}
}
