package dlock

// The test options that set a Client's hooks (hooks.go). Client only.

// withClock sets the clock the lease logic reads; tests use it to skew and
// drift clients' clocks.
func withClock(k clock) Option {
	return clientOnly("withClock", func(c *config) { c.hook().clock = k })
}

// withPacer paces the Client's waits with p instead of rulesPacer.
func withPacer(p pacer) Option {
	return clientOnly("withPacer", func(c *config) { c.hook().pacer = p })
}

// withFlaw makes the Client's logic deliberately unsound.
func withFlaw(f flaw) Option {
	return clientOnly("withFlaw", func(c *config) { c.hook().flaw = f })
}

// withStoreWrapper wraps the Client's store; tests use it to inject faults.
func withStoreWrapper(wrap func(store) store) Option {
	return clientOnly("withStoreWrapper", func(c *config) { c.hook().wrap = wrap })
}

// hook returns c's hooks, made on first use.
func (c *config) hook() *hooks {
	if c.hooks == nil {
		c.hooks = &hooks{}
	}
	return c.hooks
}
