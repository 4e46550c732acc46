package stress

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Network faults a worker injects on its own link to the server, through a
// toxiproxy proxy it runs in process (Shopify's, as a library): every
// connection of the worker's Client and of its register writes crosses it.
// A worker injects them at chosen moments of its own work, so that each
// lands in the phase it is meant for.
const (
	faultLatency      = "latency"       // replies delayed past the extension cadence, for a while, while holding
	faultResetAcquire = "reset-acquire" // the connection reset as the acquire's reply comes back: applied, unseen
	faultResetExtend  = "reset-extend"  // connections reset as replies come back, for over a cadence, while holding
	faultResetRelease = "reset-release" // the connection reset as the release's reply comes back
	faultBlackhole    = "blackhole"     // no byte passes, either way, for longer than the TTL, while holding
)

var netFaultKinds = []string{faultLatency, faultResetAcquire, faultResetExtend, faultResetRelease, faultBlackhole}

// cadence is the Clients' extension interval (the default, TTL/3).
const cadence = ttl / 3

// netFaults is a worker's proxy and the faults it may inject.
type netFaults struct {
	proxy *toxiproxy.Proxy
	kinds []string
}

// startNetFaults starts a proxy to the server of uri and returns it with the
// URI that goes through it.
func startNetFaults(uri string, kinds []string) (*netFaults, string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, "", err
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "mongo", "127.0.0.1:0", u.Host)
	if err := p.Start(); err != nil {
		return nil, "", err
	}
	u.Host = p.Listen
	return &netFaults{proxy: p, kinds: kinds}, u.String(), nil
}

// pick returns a fault kind to inject into the next hold, or "" for none:
// one hold in three, while faults are due.
func (n *netFaults) pick(faultsUntil int64) string {
	if n == nil || len(n.kinds) == 0 || now() > faultsUntil || rand.IntN(3) != 0 {
		return ""
	}
	return n.kinds[rand.IntN(len(n.kinds))]
}

// add starts a toxic on one stream ("upstream": to the server,
// "downstream": to the worker) and returns what removes it, which may be
// called more than once.
func (n *netFaults) add(typ, stream string, attrs string) (remove func(), err error) {
	name := fmt.Sprintf("%s_%s_%d", typ, stream, rand.Int64())
	_, err = n.proxy.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(
		`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":{%s}}`, name, typ, stream, attrs)))
	if err != nil {
		return nil, fmt.Errorf("toxic %s: %w", typ, err)
	}
	return sync.OnceFunc(func() { n.proxy.Toxics.RemoveToxic(context.Background(), name) }), nil
}

// resetReplies resets each connection as the server's next reply reaches
// the proxy: requests still apply, their replies are lost.
func (n *netFaults) resetReplies() (remove func(), err error) {
	return n.add("reset_peer", "downstream", `"timeout":0`)
}

// delayReplies delays every reply by d.
func (n *netFaults) delayReplies(d time.Duration) (remove func(), err error) {
	return n.add("latency", "downstream", fmt.Sprintf(`"latency":%d`, d.Milliseconds()))
}

// blackhole drops every byte both ways, without closing anything.
func (n *netFaults) blackhole() (remove func(), err error) {
	up, err := n.add("timeout", "upstream", `"timeout":0`)
	if err != nil {
		return nil, err
	}
	down, err := n.add("timeout", "downstream", `"timeout":0`)
	if err != nil {
		up()
		return nil, err
	}
	return func() { up(); down() }, nil
}
