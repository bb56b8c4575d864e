package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// silentFlood keeps conns TCP connections per source address open to
// addr, each sending nothing (not even a ClientHello), and opens a new
// one as soon as one is closed: what anyone who can reach a node's relay
// port can do without a certificate. Sources are loopback addresses
// other than 127.0.0.1 (Linux routes all of 127.0.0.0/8 to this host),
// so the flood and the agents' own connections come from different
// addresses, as they would in the field.
type silentFlood struct {
	dials  atomic.Int64 // connections established so far
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startSilentFlood(addr string, sources []string, conns int) *silentFlood {
	ctx, cancel := context.WithCancel(context.Background())
	f := &silentFlood{cancel: cancel}
	for _, src := range sources {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		for range conns {
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				buf := make([]byte, 1)
				for ctx.Err() == nil {
					c, err := d.DialContext(ctx, "tcp", addr)
					if err != nil {
						continue // reset before connect returned: open another
					}
					f.dials.Add(1)
					stop := context.AfterFunc(ctx, func() { c.Close() })
					c.Read(buf) // until the node closes it
					stop()
					c.Close()
				}
			}()
		}
	}
	return f
}

func (f *silentFlood) stop() {
	f.cancel()
	f.wg.Wait()
}

// TestSilentFloodPeerStillDelivers (issue 20, item 1): while 320
// connections from eight addresses that never send a ClientHello are
// held open against b (and reopened as soon as b closes one), a, a
// configured peer, still delivers every segment to b. Before the listener
// shed such connections they took all 64 handshake slots, each until b's
// handshake timeout (its dial_timeout, 2 s here), and a's dials, queued
// behind them, ran out of a's 2 s dial_timeout: nothing was delivered for
// as long as the flood lasted.
func TestSilentFloodPeerStillDelivers(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "a", "b")
	a, b := c.nodes["a"], c.nodes["b"]
	b.start()
	var sources []string
	for i := 2; i < 10; i++ {
		sources = append(sources, "127.0.0."+strconv.Itoa(i))
	}
	const perSource = 40
	flood := startSilentFlood(b.listen, sources, perSource)
	defer flood.stop()
	eventually(t, "the flood connected", func() bool { return flood.dials.Load() >= int64(len(sources)*perSource) })
	before := flood.dials.Load()

	a.start()
	const segments = 20
	for i := range segments {
		content := bytes.Repeat([]byte{byte(i)}, 4096+i)
		id := fmt.Sprintf("seg-%02d", i)
		if _, err := a.client.PutSegment(context.Background(), id, int64(len(content)), digest(content), bytes.NewReader(content)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range segments {
		id := fmt.Sprintf("seg-%02d", i)
		eventually(t, "b acked "+id+" under the flood", a.inState(id, "b", "acked"))
	}
	if after := flood.dials.Load(); after <= before {
		t.Fatalf("the flood stopped connecting (%d dials, %d before a started)", after, before)
	}
	shed := floodMetric(t, b, `edged_inbound_handshakes_shed_total{reason="address_limit"}`)
	if shed == 0 {
		t.Errorf("b shed no connection for its address limit:\n%s", grepLines(b.log(), "shed"))
	}
	if h := floodMetric(t, b, "edged_inbound_handshakes"); h > 64 {
		t.Errorf("b reports %d handshakes in progress, above its 64 slots", h)
	}
	t.Logf("flood: %d connections; b shed %d at the address limit, %d evicted", flood.dials.Load(), shed,
		floodMetric(t, b, `edged_inbound_handshakes_shed_total{reason="evicted"}`))
}

// floodMetric reads one counter from n's /metrics.
func floodMetric(t *testing.T, n *node, name string) int {
	t.Helper()
	m, err := n.client.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return int(x)
		}
	}
	return 0
}
