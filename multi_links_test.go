package dlock

import (
	"context"
	"time"
)

// The test stores' links implement the store methods of MultiMutex here.

func (l *scaleLink) acquireAll(ctx context.Context, as []attempt) ([]bool, error) {
	l.send(opAcquire)
	defer l.back()
	return l.st.acquireAll(ctx, as)
}

func (l *scaleLink) readAll(ctx context.Context, keys []string) ([]record, Token, error) {
	l.send(opRead)
	defer l.back()
	return l.st.readAll(ctx, keys)
}

// acquireAll sends the acquires as one request, as the bulk write it is;
// each that applied is a write of its hold, sent at sent.
func (l *simLink) acquireAll(ctx context.Context, as []attempt) ([]bool, error) {
	sent := time.Now()
	return send(l, ctx, func(ctx context.Context) ([]bool, error) {
		took, err := l.st.acquireAll(ctx, as)
		for i, a := range as {
			if err == nil && took[i] {
				l.k.wrote(a.holdKey(), sent)
			}
		}
		return took, err
	})
}

func (l *simLink) readAll(ctx context.Context, keys []string) ([]record, Token, error) {
	type reply struct {
		recs  []record
		floor Token
	}
	r, err := send(l, ctx, func(ctx context.Context) (reply, error) {
		recs, floor, err := l.st.readAll(ctx, keys)
		return reply{recs, floor}, err
	})
	return r.recs, r.floor, err
}
