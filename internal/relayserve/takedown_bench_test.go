package relayserve_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/internal/relayserve/servetest"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore/takedowns"
)

// BenchmarkTakedownRelaySide measures the relay's share of a takedown's
// latency in a real relay serve over mutual TLS: from POST /v1/takedowns to
// every order readable by its holder (three nodes polling GET /v1/orders
// every 5 ms), and from the request to the status answering complete after
// the three receipts were posted as each order arrived. What a takedown
// takes end to end adds edged's relay_api.order_interval (30 s by default)
// and the eviction. Reported: request→orders and request→complete, p50 and
// p99 in ms over b.N takedowns.
func BenchmarkTakedownRelaySide(b *testing.B) {
	dir := pkitest.New(b, "edge-a", "edge-b", "edge-c")
	pkitest.Issue(b, dir, "server", pki.UsageServer)
	pkitest.Issue(b, dir, "td-op", pki.UsageClient)
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
db: %s
tls: {cert: %s, key: %s, client_ca: %s}
alarms: {sweep_interval: 1m}
log_level: warn
principals:
  td-op: {takedown: true}
  edge-a: {hold: true}
  edge-b: {hold: true}
  edge-c: {hold: true}
`, filepath.Join(b.TempDir(), "relay.db"), filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"), filepath.Join(dir, "ca.crt"))
	p := servetest.Start(b, relayBin, servetest.WriteConfig(b, cfg))
	client := func(n string) *http.Client {
		return p.Client(servetest.ClientTLS(b, filepath.Join(dir, "ca.crt"), filepath.Join(dir, n+".crt"), filepath.Join(dir, n+".key")))
	}
	call := func(c *http.Client, method, path string, body []byte, out any, hdr ...string) int {
		req, _ := http.NewRequest(method, p.URL+path, bytes.NewReader(body))
		if body == nil {
			req.Body = nil
		}
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		if out != nil && resp.StatusCode == 200 {
			json.Unmarshal(data, out)
		}
		return resp.StatusCode
	}
	nodes := []string{"edge-a", "edge-b", "edge-c"}
	clients := map[string]*http.Client{}
	for _, n := range nodes {
		clients[n] = client(n)
	}
	op := client("td-op")
	cursor := map[string]string{}
	var toOrders, toComplete []float64
	digest := strings.Repeat("9e", 32)
	b.ResetTimer()
	for i := range b.N {
		content := fmt.Sprintf("seg-%d", i)
		for _, n := range nodes {
			body := fmt.Sprintf(`{"reports":[{"content_id":%q,"sha256":%q,"size":1,"state":"held","observed_ms":%d}]}`, content, digest, time.Now().UnixMilli())
			if s := call(clients[n], "POST", "/v1/holdings", []byte(body), nil, "Idempotency-Key", content); s != 200 {
				b.Fatalf("holdings: %d", s)
			}
		}
		for {
			var h api.HoldersResponse
			call(op, "GET", "/v1/holdings/"+content, nil, &h)
			if len(h.Holders) == 3 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		start := time.Now()
		var td api.TakedownResponse
		if s := call(op, "POST", "/v1/takedowns", []byte(fmt.Sprintf(`{"content_id":%q,"reason":"bench"}`, content)), &td); s != 200 {
			b.Fatalf("takedown: %d", s)
		}
		pending := slices.Clone(nodes)
		for len(pending) > 0 {
			for j := 0; j < len(pending); j++ {
				n := pending[j]
				var o api.OrdersResponse
				q := ""
				if cursor[n] != "" {
					q = "?after=" + cursor[n]
				}
				call(clients[n], "GET", "/v1/orders"+q, nil, &o)
				if len(o.Orders) == 0 {
					continue
				}
				ord := o.Orders[len(o.Orders)-1]
				cursor[n] = ord.Cursor
				line := signReceipt(b, keyPairOf(b, dir, n), n, takedowns.Order{Request: ord.Request, ContentID: ord.ContentID, SHA256: ord.SHA256})
				if s := call(clients[n], "POST", "/v1/receipts", line, nil); s != 200 {
					b.Fatalf("receipt: %d", s)
				}
				pending = slices.Delete(pending, j, j+1)
				j--
			}
			if len(pending) > 0 {
				time.Sleep(5 * time.Millisecond)
			}
		}
		toOrders = append(toOrders, float64(time.Since(start).Milliseconds()))
		for {
			var st takedowns.Status
			call(op, "GET", "/v1/takedowns/"+td.ID, nil, &st)
			if st.Complete {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		toComplete = append(toComplete, float64(time.Since(start).Milliseconds()))
	}
	b.StopTimer()
	q := func(v []float64, p float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[min(len(s)-1, int(p*float64(len(s))))]
	}
	b.ReportMetric(q(toOrders, 0.5), "orders-p50-ms")
	b.ReportMetric(q(toOrders, 0.99), "orders-p99-ms")
	b.ReportMetric(q(toComplete, 0.5), "complete-p50-ms")
	b.ReportMetric(q(toComplete, 0.99), "complete-p99-ms")
}
