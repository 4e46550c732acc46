package stress

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
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
	staleReads               int // fenced reads refused
	accepted, stale, unknown int
	late                     int            // writes admitted after the faults stopped
	faults                   map[string]int // injected, by kind
	lost                     int            // holds whose Lost channel closed
	margins                  []time.Duration
	excused                  int // holds taken over from a frozen or killed holder
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

// checkTakeovers checks that a holder sees its loss (its Lost channel
// closes) before another process takes the key over. It takes each key's
// holds in token order and judges each against the next one, when that one
// is another process's. A hold starts at its Lock call: the worker's
// lock-call on the key just before the acquired (the acquired itself when
// there is none). The rules:
//
//   - Handed on: the holder logged release (just before calling Unlock)
//     before the next hold was acquired. Not judged: its lease may still
//     run out while the release's reply is on its way.
//   - Excused: the holder was frozen (SIGSTOP, from the parent's fault
//     event to its thawed event) at some moment from its Lock call to the
//     next acquisition, or killed (SIGKILL, the parent's fault event)
//     before the next acquisition. Frozen, it cannot see its loss in time,
//     which is what fencing is for; killed, it logs nothing more. The
//     window opens at the Lock call, not at the acquired event: a process
//     frozen after its acquire was sent but before it logged acquired logs
//     that after the thaw, though its lease ran out during the freeze (a
//     freeze of 1.5 TTL then shows as a loss logged about 0.5 TTL after
//     the takeover). The cost: a freeze while Lock still waits excuses the
//     hold that follows it. The window closes at the next acquisition: a
//     holder running then had its local deadline pass, and logged the
//     loss, before it. Excused holds are not measured.
//   - Lost before the next acquisition: the gap is the margin (r.margins).
//   - Lost at or after the next acquisition: a violation.
//   - No loss logged at all: a violation, "taken over with no loss seen".
//
// The end of a run needs no rule: the workers release their last holds,
// and a key's last hold has no next one. A loss is logged with the time
// the worker saw Done close (runWorker): the rules take its scheduling
// delay to be shorter than the margin.
func checkTakeovers(events []event, r *report) {
	type hold struct {
		p                              int
		shared                         bool
		call, acquired, lost, released int64
	}
	holds := map[string]map[uint64]*hold{}
	calling := map[int]event{}     // per process: its last Lock call not yet paired
	frozen := map[int][][2]int64{} // per process: from SIGSTOP to SIGCONT
	killed := map[int]int64{}      // per process: when the parent sent SIGKILL
	for _, e := range events {
		switch e.Op {
		case opLockCall:
			calling[e.P] = e
		case opAcquired:
			h := &hold{p: e.P, shared: e.Sh, call: e.T, acquired: e.T}
			if c, ok := calling[e.P]; ok && c.Key == e.Key {
				h.call = c.T
			}
			delete(calling, e.P)
			if holds[e.Key] == nil {
				holds[e.Key] = map[uint64]*hold{}
			}
			if o := holds[e.Key][e.Tok]; o != nil { // pruning must not let a token come back
				r.violations = append(r.violations, fmt.Sprintf("%s: token %d handed out twice: process %d at %d, process %d at %d", e.Key, e.Tok, o.p, o.acquired, e.P, e.T))
			}
			holds[e.Key][e.Tok] = h
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
			switch e.Res {
			case faultFreeze:
				frozen[e.P] = append(frozen[e.P], [2]int64{e.T, math.MaxInt64})
			case faultKill:
				killed[e.P] = e.T
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
			// The hold that takes over from h: the next one, or, for a
			// shared hold, the next exclusive one (shared holds overlap,
			// and a Semaphore's permits have none).
			h, j := byTok[tok], i+1
			for h.shared && j < len(toks) && byTok[toks[j]].shared {
				j++
			}
			if j == len(toks) {
				continue
			}
			next := byTok[toks[j]]
			if next.p == h.p || h.released != 0 && h.released < next.acquired {
				continue // the holder's own next hold, or handed on
			}
			kill, dead := killed[h.p]
			switch {
			case dead && kill < next.acquired || wasFrozen(h.p, h.call, next.acquired):
				r.excused++ // killed or frozen: neither judged nor measured
			case h.lost != 0 && h.lost < next.acquired:
				r.margins = append(r.margins, time.Duration(next.acquired-h.lost))
			case h.lost != 0:
				r.violations = append(r.violations, fmt.Sprintf(
					"%s: token %d (process %d) lost at %d, after process %d acquired token %d at %d",
					key, tok, h.p, h.lost, next.p, toks[j], next.acquired))
			default:
				r.violations = append(r.violations, fmt.Sprintf(
					"%s: token %d (process %d, acquired at %d) taken over with no loss seen: process %d acquired token %d at %d",
					key, tok, h.p, h.acquired, next.p, toks[j], next.acquired))
			}
		}
	}
}

// checkExclusion: for each key, every instant at which a holder saw its
// lease valid precedes every instant at which a holder with a newer token
// saw its own valid, unless both holds are shared (an RWMutex's readers):
// two holders never both believed they held the key, and never a writer
// beside a reader. For the Semaphore's key, no instant lies within the
// valid spans of more than semPermits holds.
func checkExclusion(events []event, r *report) {
	type span struct {
		first, last int64
		shared      bool
	}
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
			s = &span{e.T, e.T, e.Sh}
			holds[e.Key][e.Tok] = s
			r.holds++
		}
		s.first, s.last = min(s.first, e.T), max(s.last, e.T)
	}
	for key, byTok := range holds {
		toks := slices.Sorted(maps.Keys(byTok))
		if key == semKey {
			// A sweep: +1 at each span's first instant, -1 after its last.
			type edge struct {
				t int64
				d int
			}
			var edges []edge
			for _, s := range byTok {
				edges = append(edges, edge{s.first, 1}, edge{s.last + 1, -1})
			}
			slices.SortFunc(edges, func(a, b edge) int { return cmp.Or(cmp.Compare(a.t, b.t), cmp.Compare(a.d, b.d)) })
			n := 0
			for _, e := range edges {
				if n += e.d; n > semPermits {
					r.violations = append(r.violations, fmt.Sprintf("%s: %d permits valid at %d, of %d", key, n, e.t, semPermits))
					break
				}
			}
			continue
		}
		for i, t := range toks {
			for _, u := range toks[i+1:] { // u newer than t
				older, newer := byTok[t], byTok[u]
				if older.shared && newer.shared {
					continue
				}
				if newer.first <= older.last {
					r.violations = append(r.violations, fmt.Sprintf(
						"%s: token %d valid at %d, token %d still valid at %d", key, u, newer.first, t, older.last))
				}
			}
		}
	}
}

// Register operations for porcupine.
type (
	regInput struct {
		write  bool
		fenced bool // a read that raises the fence to tok (dlock.FindFenced); writes always do
		tok    uint64
		v      int64
	}
	regState struct {
		v     int64
		fence uint64 // highest token admitted
	}
)

// registerModel: a register behind a fence. A write is admitted when its
// token is at least the highest admitted so far, and then sets the value
// and the fence; a fenced read likewise, and then raises the fence and
// returns the value. An operation reported ok must have been admitted, one
// reported stale must not; one whose outcome is unknown may have been
// admitted or not, at any moment of its span (porcupine tries both). A
// plain read returns the value. A read's output is the value read, or its
// outcome (resStale, resUnknown) when it returned none.
var registerModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{regState{}} },
	Step: func(state, input, output any) []any {
		s, in := state.(regState), input.(regInput)
		admitted := in.tok >= s.fence
		next := regState{v: in.v, fence: in.tok}
		if !in.write {
			next.v = s.v
			if !in.fenced {
				next, admitted = s, true
			}
			if v, ok := output.(int64); ok {
				if admitted && v == s.v {
					return []any{next}
				}
				return nil
			}
		}
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

// checkRegisters checks each key's register:
//
//   - its reads and writes are linearizable under registerModel
//     (porcupine), each spanning from its call to its return; a write
//     that never returned (its process was killed) has an unknown outcome
//     and spans to end;
//   - no two writes reported ok wrote the same value: each writes the
//     value it read plus one, so a repeat is two holders that read the
//     same value, a lost update;
//   - the final value v satisfies ok <= v <= ok+unknown, with ok the writes
//     reported ok and unknown those of unknown outcome: every admitted
//     write added one, and each unknown one may have.
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
			var out any = e.V
			if e.Res != resOK {
				out = e.Res
			}
			if e.Res == resStale {
				r.staleReads++
			}
			ops[c.Key] = append(ops[c.Key], porcupine.Operation{ClientId: c.P, Input: regInput{fenced: !c.Sh, tok: c.Tok}, Call: c.T, Output: out, Return: e.T})
		case opWriteRet:
			c := calls[e.ID]
			delete(calls, e.ID)
			r.writes++
			ops[c.Key] = append(ops[c.Key], porcupine.Operation{ClientId: c.P, Input: regInput{write: true, tok: c.Tok, v: c.V}, Call: c.T, Output: e.Res, Return: e.T})
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
		switch {
		case c.Op == opWriteCall:
			r.writes++
			r.unknown++
			unknown[c.Key]++
			ops[c.Key] = append(ops[c.Key], porcupine.Operation{ClientId: c.P, Input: regInput{write: true, tok: c.Tok, v: c.V}, Call: c.T, Output: resUnknown, Return: end})
		case !c.Sh: // a fenced read may have raised the fence
			ops[c.Key] = append(ops[c.Key], porcupine.Operation{ClientId: c.P, Input: regInput{fenced: true, tok: c.Tok}, Call: c.T, Output: resUnknown, Return: end})
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

// lastWrites describes the last n writes to key's register, in the order
// they were called: process, token, value, outcome and when each was
// called and returned, in ms before the last; for a failure to be studied.
func lastWrites(events []event, key string, n int) string {
	calls := map[int]event{}
	var ws []string
	var last int64
	for _, e := range events {
		last = max(last, e.T)
	}
	for _, e := range events {
		switch {
		case e.Op == opWriteCall && e.Key == key:
			calls[e.ID] = e
		case e.Op == opWriteRet:
			if c, ok := calls[e.ID]; ok {
				ws = append(ws, fmt.Sprintf("p%d tok %d v %d %s (%d..%d ms)", c.P, c.Tok, c.V, e.Res, (last-c.T)/1e6, (last-e.T)/1e6))
				delete(calls, e.ID)
			}
		}
	}
	for _, c := range calls {
		ws = append(ws, fmt.Sprintf("p%d tok %d v %d no return (%d ms)", c.P, c.Tok, c.V, (last-c.T)/1e6))
	}
	return strings.Join(ws[max(len(ws)-n, 0):], "; ")
}
