package daemon

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/rpc"
)

// TestSlowUploadReleasesReservation: an RPC upload holds a quota
// reservation while its body arrives. A client that stops sending, and one
// that trickles below the minimum rate, get 408; the reservation and the
// temp file are gone, and the quota is usable again.
func TestSlowUploadReleasesReservation(t *testing.T) {
	dir := pkitest.New(t, "a")
	relayLn, rpcLn := listen(t), listen(t)
	cfg := nodeConfig(t, dir, "a", relayLn.Addr().String(), rpcLn.Addr().String(), []config.Peer{})
	cfg.Storage.QuotaBytes = 4096
	cfg.Storage.MaxSegmentBytes = 4096
	n := startNode(t, cfg, relayLn, rpcLn, func(o *Options) {
		o.RPC = rpc.ServerOptions{BodyIdleTimeout: 300 * time.Millisecond, BodyMinRate: 4000}
	})
	content := []byte(strings.Repeat("x", 4000)) // the whole quota
	for _, tc := range []struct {
		name string
		// send writes (part of) the body; it returns when the server gave up.
		send func(c net.Conn)
	}{
		{"stalled", func(c net.Conn) { c.Write(content[:100]) }},
		{"trickling", func(c net.Conn) {
			// 10 bytes per 100ms = 100 B/s: never idle for 300ms, but the
			// 4000 bytes need 40s against a deadline of 0.3s + 1s.
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for i := 0; i < len(content); i += 10 {
				if _, err := c.Write(content[i : i+10]); err != nil {
					return
				}
				<-tick.C
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", rpcLn.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /v1/segments?id=slow&sha256=%s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n",
				digest(content), len(content))
			reply := make(chan *http.Response, 1)
			go func() {
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Errorf("read response: %v", err)
				}
				reply <- resp
			}()
			go tc.send(c)
			resp := <-reply
			if resp == nil {
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestTimeout {
				t.Fatalf("slow upload answered %s, want 408", resp.Status)
			}
			c.Close() // ends the trickle
			u, err := n.client.Quota(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if u.ReservedBytes != 0 || u.ReservedSegments != 0 || u.Bytes != 0 {
				t.Fatalf("after the timeout: %+v; want nothing reserved or stored", u)
			}
			des, err := os.ReadDir(filepath.Join(cfg.Storage.Dir, "segments"))
			if err != nil || len(des) != 0 {
				t.Fatalf("segments/ holds %v (%v); want no temp file", des, err)
			}
		})
	}
	// The quota the slow clients held is free: a full-quota upload fits.
	put(t, n, "fast", content)
}
