package transport

import (
	"context"
	"fmt"
	"testing"

	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/wire"
)

// TestVersionNegotiation: both ends run the highest version both speak,
// whichever side is restricted to version 1 (an agent that predates
// negotiation offers and selects no ALPN protocol, which Wire.Version 1
// reproduces), and the HELLOs agree with it.
func TestVersionNegotiation(t *testing.T) {
	for _, tc := range []struct{ client, server, want int }{
		{0, 0, wire.Version},
		{4, 4, wire.Version4},
		{4, 3, wire.Version3},
		{3, 4, wire.Version3},
		{3, 3, wire.Version3},
		{3, 2, wire.Version2},
		{2, 3, wire.Version2},
		{2, 2, wire.Version2},
		{1, 2, wire.Version1},
		{2, 1, wire.Version1},
		{1, 1, wire.Version1},
	} {
		t.Run(fmt.Sprintf("client%d-server%d", tc.client, tc.server), func(t *testing.T) {
			ctx := context.Background()
			dir := pkitest.New(t, "a", "b")
			srv := listen(t, newTransport(t, dir, "a", []string{"b"}, func(c *Config) { c.Wire.Version, c.Wire.Window = tc.server, 7 }))
			cli := newTransport(t, dir, "b", []string{"a"}, func(c *Config) { c.Wire.Version, c.Wire.Window = tc.client, 9 })
			accepted := acceptAsync(srv)
			c, err := cli.Dial(ctx, srv.Addr().String(), "a")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			res := <-accepted
			if res.err != nil {
				t.Fatal(res.err)
			}
			defer res.conn.Close()
			if c.Version() != tc.want || res.conn.Version() != tc.want {
				t.Fatalf("versions client %d, server %d; want %d", c.Version(), res.conn.Version(), tc.want)
			}
			wantCli, wantSrv := 1, 1 // stop-and-wait
			if tc.want >= wire.Version2 {
				wantCli, wantSrv = 7, 9 // each side's window is the peer's HELLO
			}
			if c.PeerWindow() != wantCli || res.conn.PeerWindow() != wantSrv {
				t.Fatalf("peer windows client %d, server %d; want %d, %d", c.PeerWindow(), res.conn.PeerWindow(), wantCli, wantSrv)
			}
		})
	}
}
