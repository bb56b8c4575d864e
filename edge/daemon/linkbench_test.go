package daemon

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/linkem"
	"github.com/relay-dev/relay/edge/pki/pkitest"
)

// The emulated link of issue 10's goals: 50 ms one-way, 100 Mbit/s, a
// buffer above the bandwidth-delay product (as linkem's own benchmark).
const (
	linkLatency = 50 * time.Millisecond
	linkBW      = 100e6
	linkBuffer  = 4 << 20
)

// BenchmarkRelayLink1MiB and BenchmarkRelayLink4KiB measure segments
// acknowledged per second from one in-process daemon to another through
// linkem at 50 ms one-way and 100 Mbit/s (real stores, mutual TLS, the
// negotiated protocol: version 2, pipelined), as bytes per second against
// one raw TLS 1.3 stream copying 32 MiB through an identical link in the
// same run. Reported: relay-Mbit/s, tls-Mbit/s, relay/tls (the issue's
// figure: ≥ 0.8 for 1 MiB, ≥ 0.5 for 4 KiB). The clock starts when the
// sender starts serving, so dials and handshakes (several round trips
// each) are included.
func BenchmarkRelayLink1MiB(b *testing.B) { benchRelayLink(b, 1<<20, 48) }

// BenchmarkRelayLink4KiB: see BenchmarkRelayLink1MiB. 8192 segments are
// the 32 MiB the baseline copies (4000 before: half of it, so the fixed
// start-up of dials, handshakes and the first QUERY, about 0.5 s at this
// latency, weighed twice as much as against the baseline). The receiver's
// segment quota is lifted: rounds add up on it.
func BenchmarkRelayLink4KiB(b *testing.B) { benchRelayLink(b, 4<<10, 8192) }

func benchRelayLink(b *testing.B, size, segments int) {
	dir := pkitest.New(b, "a", "b")
	bRelay, bRPC := listen(b), listen(b)
	bcfg := nodeConfig(b, dir, "b", bRelay.Addr().String(), bRPC.Addr().String(),
		[]config.Peer{{ID: "a", Address: "127.0.0.1:1"}})
	bcfg.Storage.QuotaSegments = 1 << 20
	startNode(b, bcfg, bRelay, bRPC)
	link, err := linkem.New(linkem.Config{Target: bRelay.Addr().String(), Latency: linkLatency, Bandwidth: linkBW, Buffer: linkBuffer})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { link.Close() })
	aRelay, aRPC := listen(b), listen(b)
	cfg := nodeConfig(b, dir, "a", aRelay.Addr().String(), aRPC.Addr().String(),
		[]config.Peer{{ID: "b", Address: link.Addr().String()}})
	aRelay.Close()
	aRPC.Close()
	tlsRate := rawTLSThroughLink(b, dir)

	var relayRate float64
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		cfg.Storage.Dir = b.TempDir()
		send, err := New(cfg, Options{Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		content := bytes.Repeat([]byte{byte(i)}, size)
		for j := range segments {
			binary.BigEndian.PutUint32(content, uint32(j))
			e, err := send.store.Write(fmt.Sprintf("r%d-s%05d", i, j), int64(size), digest(content), bytes.NewReader(content), "")
			if err != nil {
				b.Fatal(err)
			}
			if err := send.ex.Schedule(e); err != nil {
				b.Fatal(err)
			}
		}
		send.ListenOn(listen(b), listen(b))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		b.StartTimer()
		start := time.Now()
		go func() { done <- send.Serve(ctx) }()
		awaitAcked(b, send, "b", segments)
		elapsed := time.Since(start)
		b.StopTimer()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		relayRate = float64(size*segments) * 8 / 1e6 / elapsed.Seconds()
		b.StartTimer()
	}
	b.ReportMetric(relayRate, "relay-Mbit/s")
	b.ReportMetric(tlsRate, "tls-Mbit/s")
	b.ReportMetric(relayRate/tlsRate, "relay/tls")
}

// rawTLSThroughLink copies 32 MiB over one TLS 1.3 stream (handshake done
// before the clock starts) through a link configured like the relay's,
// with a one-byte reply, and returns Mbit/s: linkem's baseline.
func rawTLSThroughLink(b *testing.B, dir string) float64 {
	const size = 32 << 20
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	link, err := linkem.New(linkem.Config{Target: ln.Addr().String(), Latency: linkLatency, Bandwidth: linkBW, Buffer: linkBuffer})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { link.Close() })
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "b.crt"), filepath.Join(dir, "b.key"))
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
		defer tc.Close()
		if _, err := io.CopyN(io.Discard, tc, size); err == nil {
			tc.Write([]byte{1})
		}
	}()
	tc, err := tls.Dial("tcp", link.Addr().String(), &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	if err != nil {
		b.Fatal(err)
	}
	defer tc.Close()
	data := make([]byte, size)
	start := time.Now()
	if _, err := tc.Write(data); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(tc, make([]byte, 1)); err != nil {
		b.Fatal(err)
	}
	return float64(size) * 8 / 1e6 / time.Since(start).Seconds()
}
