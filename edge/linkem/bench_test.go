package linkem

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"
)

// BenchmarkLink50ms100Mbit measures what the emulated link delivers at
// 50 ms one-way latency and 100 Mbit/s (Buffer 4 MiB, above the 625 KB
// bandwidth-delay product): a 32 MiB copy with a one-byte reply, once over
// plain TCP and once over TLS 1.3 (handshake done before the clock starts),
// through the same link. Reported: tcp-Mbit/s and tls-Mbit/s, and each as a
// ratio of the configured bandwidth (tcp/bw, tls/bw). The copy cannot beat
// size·8/bw + 2·latency (the reply crosses back), so the ceiling is 0.964.
// The TLS figure is the baseline issue 10's edge-agent benchmarks through
// the link compare against.
func BenchmarkLink50ms100Mbit(b *testing.B) {
	const (
		size    = 32 << 20
		latency = 50 * time.Millisecond
		bw      = 100e6
	)
	ln, accepted := target(b)
	l := newLink(b, Config{Target: ln.Addr().String(), Latency: latency, Bandwidth: bw, Buffer: 4 << 20})
	srvCfg, cliCfg := tlsConfigs(b)
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 131 >> 3)
	}

	// sink reads size bytes and replies with one byte, until EOF.
	sink := func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 64<<10)
		for {
			if _, err := io.CopyBuffer(io.Discard, io.LimitReader(c, size), buf); err != nil {
				return
			}
			if _, err := c.Write([]byte{1}); err != nil {
				return
			}
		}
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return c
	}
	plain := dial()
	go sink(<-accepted)
	tc := tls.Client(dial(), cliCfg)
	go sink(tls.Server(<-accepted, srvCfg))
	if err := tc.Handshake(); err != nil {
		b.Fatal(err)
	}
	copyOnce := func(c net.Conn) time.Duration {
		start := time.Now()
		if _, err := c.Write(data); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}

	var tcpTime, tlsTime time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tcpTime += copyOnce(plain)
		tlsTime += copyOnce(tc)
	}
	b.StopTimer()
	mbit := float64(size) * 8 * float64(b.N) / 1e6
	tcpRate, tlsRate := mbit/tcpTime.Seconds(), mbit/tlsTime.Seconds()
	b.ReportMetric(tcpRate, "tcp-Mbit/s")
	b.ReportMetric(tlsRate, "tls-Mbit/s")
	b.ReportMetric(tcpRate/(bw/1e6), "tcp/bw")
	b.ReportMetric(tlsRate/(bw/1e6), "tls/bw")
}
