package stress

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// readHistory parses a history file.
func readHistory(path string) ([]event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var events []event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("history line %q: %w", sc.Text(), err)
		}
		events = append(events, e)
	}
	return events, sc.Err()
}

// report is what a history shows.
type report struct {
	holds, reads, writes     int
	accepted, stale, unknown int
	late                     int            // writes admitted after the faults stopped
	faults                   map[string]int // injected, by kind
	lost                     int            // holds whose Lost channel closed
	margins                  []time.Duration
	lostUpdates              int
	violations               []string
}

// minMargin is the smallest Lost-to-takeover margin, or 0 for none.
func (r *report) minMargin() time.Duration {
	if len(r.margins) == 0 {
		return 0
	}
	return slices.Min(r.margins)
}

// check runs every check on a history. final holds the registers' final
// values; end stands for the return of operations a killed process never
// finished; writes called after calm count as progress after the faults.
func check(events []event, final map[string]int64, end, calm int64) report {
	r := report{faults: map[string]int{}}
	calls := map[int]event{}
	for _, e := range events {
		switch e.Op {
		case opFault:
			r.faults[e.Res]++
		case opWriteCall:
			calls[e.ID] = e
		case opWriteRet:
			if e.Res == resOK && calls[e.ID].T > calm {
				r.late++
			}
		}
	}
	checkExclusion(events, &r)
	checkRegisters(events, final, end, &r)
	checkTakeovers(events, &r)
	return r
}

// checkTakeovers: when a hold is lost (its Lost channel closes) and another
// process takes the key over next, the loss comes first; the gap is the
// margin. A hold whose holder called Unlock before the next hold began was
// handed on, not taken over (its lease may still run out while the
// release's reply is on its way). A process frozen (SIGSTOP) during its
// hold cannot see its loss in time, which is what fencing is for: those
// holds are not measured.
func checkTakeovers(events []event, r *report) {
	type hold struct {
		p                        int
		acquired, lost, released int64
	}
	holds := map[string]map[uint64]*hold{}
	frozen := map[int][][2]int64{} // per process: from SIGSTOP to SIGCONT
	for _, e := range events {
		switch e.Op {
		case opAcquired:
			if holds[e.Key] == nil {
				holds[e.Key] = map[uint64]*hold{}
			}
			holds[e.Key][e.Tok] = &hold{p: e.P, acquired: e.T}
		case opLost:
			r.lost++
			if h := holds[e.Key][e.Tok]; h != nil {
				h.lost = e.T
			}
		case opRelease:
			if h := holds[e.Key][e.Tok]; h != nil {
				h.released = e.T
			}
		case opFault:
			if e.Res == faultFreeze {
				frozen[e.P] = append(frozen[e.P], [2]int64{e.T, math.MaxInt64})
			}
		case opThawed:
			if f := frozen[e.P]; len(f) > 0 {
				f[len(f)-1][1] = e.T
			}
		}
	}
	wasFrozen := func(p int, from, to int64) bool {
		for _, f := range frozen[p] {
			if f[0] < to && f[1] > from {
				return true
			}
		}
		return false
	}
	for key, byTok := range holds {
		toks := slices.Sorted(maps.Keys(byTok))
		for i, tok := range toks[:max(len(toks)-1, 0)] {
			h, next := byTok[tok], byTok[toks[i+1]]
			handedOn := h.released != 0 && h.released < next.acquired
			if h.lost == 0 || next.p == h.p || handedOn || wasFrozen(h.p, h.acquired, h.lost) {
				continue
			}
			if next.acquired <= h.lost {
				r.violations = append(r.violations, fmt.Sprintf(
					"%s: token %d (process %d) lost at %d, after process %d acquired token %d at %d",
					key, tok, h.p, h.lost, next.p, toks[i+1], next.acquired))
				continue
			}
			r.margins = append(r.margins, time.Duration(next.acquired-h.lost))
		}
	}
}

// checkExclusion: for each key, every instant at which a holder saw its
// lease valid precedes every instant at which a holder with a newer token
// saw its own valid. Two holders never both believed they held the key.
func checkExclusion(events []event, r *report) {
	type span struct{ first, last int64 }
	holds := map[string]map[uint64]*span{}
	for _, e := range events {
		if e.Op != opValid {
			continue
		}
		if holds[e.Key] == nil {
			holds[e.Key] = map[uint64]*span{}
		}
		s := holds[e.Key][e.Tok]
		if s == nil {
			s = &span{e.T, e.T}
			holds[e.Key][e.Tok] = s
			r.holds++
		}
		s.first, s.last = min(s.first, e.T), max(s.last, e.T)
	}
	for key, byTok := range holds {
		toks := slices.Sorted(maps.Keys(byTok))
		var lastOlder int64 = math.MinInt64
		var olderTok uint64
		for _, t := range toks {
			if s := byTok[t]; s.first <= lastOlder {
				r.violations = append(r.violations, fmt.Sprintf(
					"%s: token %d valid at %d, token %d still valid at %d", key, t, s.first, olderTok, lastOlder))
			}
			if s := byTok[t]; s.last > lastOlder {
				lastOlder, olderTok = s.last, t
			}
		}
	}
}

// Register operations for porcupine.
type (
	regInput struct {
		write bool
		tok   uint64
		v     int64
	}
	regState struct {
		v     int64
		fence uint64 // highest token admitted
	}
)

// registerModel: a register behind a fence. A write is admitted when its
// token is at least the highest admitted so far; a write whose outcome is
// unknown may or may not have been applied.
var registerModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{regState{}} },
	Step: func(state, input, output any) []any {
		s, in := state.(regState), input.(regInput)
		if !in.write {
			if output.(int64) == s.v {
				return []any{s}
			}
			return nil
		}
		admitted := in.tok >= s.fence
		next := regState{v: in.v, fence: in.tok}
		switch res := output.(string); {
		case res == resOK && admitted:
			return []any{next}
		case res == resStale && !admitted:
			return []any{s}
		case res == resUnknown && admitted:
			return []any{s, next}
		case res == resUnknown:
			return []any{s}
		}
		return nil
	},
}).ToModel()

// checkRegisters checks, for each key, that the register's history is
// linearizable (porcupine), that no two admitted writes wrote the same
// value (a lost update), and that the final value is what the admitted
// writes, plus any of unknown outcome, account for. end stands for the
// return of operations a killed process never finished.
func checkRegisters(events []event, final map[string]int64, end int64, r *report) {
	calls := map[int]event{}
	ops := map[string][]porcupine.Operation{}
	written := map[string]map[int64]int{}
	accepted, unknown := map[string]int64{}, map[string]int64{}
	for _, e := range events {
		switch e.Op {
		case opReadCall, opWriteCall:
			calls[e.ID] = e
		case opReadRet:
			c := calls[e.ID]
			delete(calls, e.ID)
			r.reads++
			ops[c.Key] = append(ops[c.Key], porcupine.Operation{ClientId: c.P, Input: regInput{}, Call: c.T, Output: e.V, Return: e.T})
		case opWriteRet:
			c := calls[e.ID]
			delete(calls, e.ID)
			r.writes++
			ops[c.Key] = append(ops[c.Key], porcupine.Operation{ClientId: c.P, Input: regInput{true, c.Tok, c.V}, Call: c.T, Output: e.Res, Return: e.T})
			switch e.Res {
			case resOK:
				r.accepted++
				accepted[c.Key]++
				if written[c.Key] == nil {
					written[c.Key] = map[int64]int{}
				}
				if written[c.Key][c.V]++; written[c.Key][c.V] > 1 {
					r.lostUpdates++
					r.violations = append(r.violations, fmt.Sprintf("%s: value %d written twice: a lost update", c.Key, c.V))
				}
			case resStale:
				r.stale++
			default:
				r.unknown++
				unknown[c.Key]++
			}
		}
	}
	for _, c := range calls { // calls of killed processes: no return
		if c.Op == opWriteCall {
			r.writes++
			r.unknown++
			unknown[c.Key]++
			ops[c.Key] = append(ops[c.Key], porcupine.Operation{ClientId: c.P, Input: regInput{true, c.Tok, c.V}, Call: c.T, Output: resUnknown, Return: end})
		}
	}
	for key, h := range ops {
		if !porcupine.CheckOperations(registerModel, h) {
			r.violations = append(r.violations, fmt.Sprintf("%s: register history of %d operations is not linearizable", key, len(h)))
		}
	}
	for key, v := range final {
		if v < accepted[key] || v > accepted[key]+unknown[key] {
			r.violations = append(r.violations, fmt.Sprintf("%s: final value %d, but %d writes admitted (%d unknown)", key, v, accepted[key], unknown[key]))
		}
	}
}
