// Package memhook connects package dlocktest to the in-memory store that
// lives, unexported, in package dlock: dlock sets these functions in its
// init, dlocktest calls them. The values are dlock's own types behind any,
// so that this package imports nothing.
package memhook

var (
	// NewServer returns a new, empty in-memory lock store.
	NewServer func() any
	// NewClient returns a *dlock.Client on server (from NewServer) with
	// opts ([]dlock.Option), and its link, for SetPartitioned.
	NewClient func(server any, opts []any) (client, link any, err error)
	// SetPartitioned cuts a link (every request fails as a network fault
	// would) or mends it.
	SetPartitioned func(link any, down bool)
)
