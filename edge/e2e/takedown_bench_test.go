package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/linkem"
)

// benchEnv reads a knob of BenchmarkTakedownLatency: a duration or a count
// from the environment, def if unset.
func benchEnv[T time.Duration | int](b *testing.B, name string, def T) T {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out T
	switch p := any(&out).(type) {
	case *time.Duration:
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("%s=%q: %v", name, v, err)
		}
		*p = d
	case *int:
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("%s=%q: want a count", name, v)
		}
		*p = n
	}
	return out
}

// BenchmarkTakedownLatency is issue 23's latency goal with real processes:
// relay serve (bbolt, mutual TLS, the takedown owner) and three edged, each
// reaching the relay's API through a link of its own emulated by linkem
// (RELAY_TAKEDOWN_BENCH_LATENCY one way, 50ms by default, and
// RELAY_TAKEDOWN_BENCH_MBIT each way, 10 by default); the peer links are
// plain loopback. Every node holds every segment and has reported it; the
// benchmark then requests the takedowns one after the other and times each
// from the request's answer to the status read that first shows it
// complete (the last holder's receipt verified and delivered), polling
// every 20 ms. Edged's order_interval and report_interval are
// RELAY_TAKEDOWN_BENCH_ORDER_INTERVAL (1s by default: edged's default is
// 30s), and there are RELAY_TAKEDOWN_BENCH_N takedowns (20) per b.N.
// Figures: docs/benchmarks.md.
func BenchmarkTakedownLatency(b *testing.B) {
	latency := benchEnv(b, "RELAY_TAKEDOWN_BENCH_LATENCY", 50*time.Millisecond)
	mbit := benchEnv(b, "RELAY_TAKEDOWN_BENCH_MBIT", 10)
	interval := benchEnv(b, "RELAY_TAKEDOWN_BENCH_ORDER_INTERVAL", time.Second)
	count := benchEnv(b, "RELAY_TAKEDOWN_BENCH_N", 20) * b.N

	cl := newCluster(b, "a", "b", "c")
	a, bn, c := cl.nodes["a"], cl.nodes["b"], cl.nodes["c"]
	relay, call := startTakedownRelay(b, cl, "", true)
	u, err := url.Parse(relay.URL)
	if err != nil {
		b.Fatal(err)
	}
	var links []*linkem.Link
	for _, n := range []*node{a, bn, c} {
		l, err := linkem.New(linkem.Config{Target: u.Host, Latency: latency, Bandwidth: int64(mbit) * 1_000_000})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { l.Close() })
		links = append(links, l)
		n.relayAPI = fmt.Sprintf("  url: https://%s\n  ca: pki/ca.crt\n  report_interval: %s\n  order_interval: %s\n  backoff: {initial: 50ms, max: 200ms}\n",
			l.Addr(), interval, interval)
		n.start()
	}

	seg := func(i int) (string, []byte) {
		return fmt.Sprintf("seg-%04d", i), bytes.Repeat(fmt.Appendf(nil, "takedown bench %d ", i), 4000)
	}
	for i := range count {
		id, body := seg(i)
		putFile(b, a, id, body)
	}
	holders := func(id string) int {
		var h struct {
			Holders []struct{ Node, State string } `json:"holders"`
		}
		json.Unmarshal(call("GET", "/v1/holdings/"+id, nil), &h)
		held := 0
		for _, x := range h.Holders {
			if x.State == "held" {
				held++
			}
		}
		return held
	}
	for i := range count {
		id, _ := seg(i)
		eventually(b, id+" reported held by a, b and c", func() bool { return holders(id) == 3 })
	}

	b.ResetTimer()
	var took []time.Duration
	for i := range count {
		id, _ := seg(i)
		var td struct {
			ID      string   `json:"id"`
			Holders []string `json:"holders"`
		}
		if err := json.Unmarshal(call("POST", "/v1/takedowns", fmt.Appendf(nil, `{"content_id":%q,"reason":"bench"}`, id)), &td); err != nil || len(td.Holders) != 3 {
			b.Fatalf("takedown %+v: %v", td, err)
		}
		start := time.Now()
		for {
			var s takedownStatus
			if out := call("GET", "/v1/takedowns/"+td.ID, nil); out != nil {
				if err := json.Unmarshal(out, &s); err != nil {
					b.Fatal(err)
				}
			}
			if s.Complete {
				if s.ReceiptsVerified != 3 {
					b.Fatalf("complete with %d receipts: %+v", s.ReceiptsVerified, s)
				}
				break
			}
			if time.Since(start) > waitFor {
				b.Fatalf("takedown of %s not complete within %v: %+v", id, waitFor, s)
			}
			time.Sleep(20 * time.Millisecond) // the poll's period, part of the figure
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	q := func(p float64) time.Duration { return took[min(len(took)-1, int(p*float64(len(took))))] }
	b.ReportMetric(q(0.50).Seconds(), "p50-s")
	b.ReportMetric(q(0.99).Seconds(), "p99-s")
	b.ReportMetric(took[len(took)-1].Seconds(), "max-s")
	var up, down int64
	for _, l := range links {
		st := l.Stats()
		up += st.Up.Delivered
		down += st.Down.Delivered
	}
	b.Logf("%d takedowns, 3 holders each, link %v one way %d Mbit/s, order_interval %v: request -> complete p50 %v p99 %v max %v; relay API bytes up %d down %d",
		len(took), latency, mbit, interval, q(0.50).Round(time.Millisecond), q(0.99).Round(time.Millisecond),
		took[len(took)-1].Round(time.Millisecond), up, down)
}
