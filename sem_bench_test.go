package dlock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkSemaphoreFairness measures a Semaphore's queue on the test
// server, each Client with its own driver client:
//
//	go test -run '^$' -bench SemaphoreFairness -benchtime 1x -v .
//
// Row share: 12 Clients loop Acquire, a 20 ms hold, Release on a
// Semaphore of 2 permits for 10 s; it reports each Client's acquisitions
// as a multiple of the mean (share-min-x, share-max-x), and the wait p99
// as a multiple of the FIFO limit (fifo-x): (C−n)/n turns of a hold and
// the row's mean hand-over. Row starve: 2 Clients loop with 1 ms holds
// on 2 permits while a third makes one Acquire, five times; it reports
// the longest of those (one-acquire-max-ms). A row is not driven by b.N:
// use -benchtime 1x.
func BenchmarkSemaphoreFairness(b *testing.B) {
	b.Run("share", func(b *testing.B) {
		const clients, n, hold, dur = 12, 2, 20 * time.Millisecond, 10 * time.Second
		coll := newColl(b)
		var mu sync.Mutex
		counts := make([]int, clients)
		var waits []time.Duration
		ctx, cancel := context.WithTimeout(context.Background(), dur)
		defer cancel()
		mark := commands.since(0)
		start := time.Now()
		var wg sync.WaitGroup
		for i := range clients {
			s := newClient(b, coll).NewSemaphore("s", n)
			wg.Go(func() {
				for ctx.Err() == nil {
					called := time.Now()
					l, err := s.Acquire(ctx)
					if err != nil {
						if !errors.Is(err, ctx.Err()) {
							b.Error(err)
						}
						return
					}
					mu.Lock()
					counts[i]++
					waits = append(waits, time.Since(called))
					mu.Unlock()
					time.Sleep(hold)
					l.Release(context.Background())
				}
			})
		}
		wg.Wait()
		wall, cmds := time.Since(start), commands.since(mark)
		total := len(waits)
		if total == 0 {
			b.Fatal("no acquisitions")
		}
		slices.Sort(waits)
		mean := float64(total) / clients
		turn := wall * n / time.Duration(total) // a permit's hold and hand-over, as measured
		fifo := turn * (clients - n) / n
		p99 := waits[total*99/100]
		b.ReportMetric(float64(slices.Min(counts))/mean, "share-min-x")
		b.ReportMetric(float64(slices.Max(counts))/mean, "share-max-x")
		b.ReportMetric(float64(p99)/float64(fifo), "fifo-x")
		b.ReportMetric(float64(cmds)/float64(total), "cmds/acq")
		b.Logf("12 Clients, 2 permits, 20 ms holds: %d acquisitions in %v, per Client %d–%d, wait p50 %v p99 %v, FIFO limit %v, %.2f commands an acquisition",
			total, wall.Round(time.Millisecond), slices.Min(counts), slices.Max(counts), waits[total/2].Round(time.Millisecond), p99.Round(time.Millisecond), fifo.Round(time.Millisecond), float64(cmds)/float64(total))
	})
	b.Run("starve", func(b *testing.B) {
		coll := newColl(b)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		for range 2 {
			s := newClient(b, coll).NewSemaphore("s", 2)
			wg.Go(func() {
				for ctx.Err() == nil {
					l, err := s.Acquire(ctx)
					if err != nil {
						return
					}
					time.Sleep(time.Millisecond)
					l.Release(context.Background())
				}
			})
		}
		s := newClient(b, coll).NewSemaphore("s", 2)
		var longest time.Duration
		for range 5 {
			time.Sleep(200 * time.Millisecond) // the loop under way
			one, stop := context.WithTimeout(ctx, 20*time.Second)
			start := time.Now()
			l, err := s.Acquire(one)
			stop()
			if err != nil {
				b.Fatalf("the one Acquire, after %v: %v", time.Since(start), err)
			}
			longest = max(longest, time.Since(start))
			l.Release(context.Background())
		}
		b.ReportMetric(float64(longest.Milliseconds()), "one-acquire-max-ms")
		b.Logf("one Acquire beside two Clients looping with 1 ms holds: the longest of five took %v", longest.Round(time.Millisecond))
	})
}
