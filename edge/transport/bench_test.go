package transport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/wire"
)

// BenchmarkSegment64MiB measures one 64 MiB segment exchange over mutual
// TLS 1.3 on loopback, and in the same run a raw Go TLS 1.3 copy of 64 MiB
// with a one-byte reply, with the same certificates, once plain and once
// with the receiver computing SHA-256 as the relay must. The exchange runs
// the negotiated protocol, version 2: OFFER, ACCEPT, SEGMENT, the receiver
// hashing on another goroutine while it reads (wire.CopyHashing, as the
// segment store does), ACK. The real receive path minus the disk.
// Reported: relay-MB/s, raw-MB/s, rawsha-MB/s, relay/raw (the issue's
// figure) and relay/rawsha. ns/op covers all three legs. relay-cpu-ms and
// raw-cpu-ms are the process's CPU time (user and system) per round of the
// relay and the plain raw leg: on a machine shared with other work the
// wall-clock ratio follows their ratio, since the relay needs the
// receiver's SHA-256 on top of what the raw copy does.
func BenchmarkSegment64MiB(b *testing.B) {
	const size = 64 << 20
	ctx := context.Background()
	dir := pkitest.New(b, "a", "b")
	srv := listen(b, newTransport(b, dir, "a", []string{"b"}, nil))
	cli := newTransport(b, dir, "b", []string{"a"}, nil)

	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 131 >> 3)
	}
	sum := sha256.Sum256(data)
	offer := wire.Offer{SegmentID: "bench", Size: size, SHA256: hex.EncodeToString(sum[:])}

	// Relay receiver: the real receive path minus the disk.
	recvDone := make(chan error, 1)
	go func() {
		rc, _, err := srv.Accept()
		if err != nil {
			recvDone <- err
			return
		}
		defer rc.Close()
		for {
			req, err := rc.RecvRequest(ctx)
			if err != nil {
				recvDone <- nil // sender closed
				return
			}
			o := req.Offer
			if !req.Segment {
				if err := rc.SendAccept(ctx, o); err != nil {
					recvDone <- err
					return
				}
				continue
			}
			var sum []byte
			if err := rc.RecvPayload(ctx, o, func(r io.Reader) error {
				var err error
				_, sum, err = wire.CopyHashing(io.Discard, r)
				return err
			}); err != nil {
				recvDone <- err
				return
			}
			if hex.EncodeToString(sum) != o.SHA256 {
				recvDone <- errors.New("digest differs")
				return
			}
			if err := rc.SendAck(ctx, o.SegmentID); err != nil {
				recvDone <- err
				return
			}
		}
	}()
	sc, err := cli.Dial(ctx, srv.Addr().String(), "a")
	if err != nil {
		b.Fatal(err)
	}
	if sc.Version() != wire.Version {
		b.Fatalf("negotiated version %d", sc.Version())
	}

	// Raw TLS baseline with the same certificates and TLS version.
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "a.crt"), filepath.Join(dir, "a.key"))
	if err != nil {
		b.Fatal(err)
	}
	rawPeer := func(hash bool) *tls.Conn {
		ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ln.Close() })
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			var dst io.Writer = io.Discard
			if hash {
				dst = sha256.New()
			}
			buf := make([]byte, 64<<10)
			for {
				if _, err := io.CopyBuffer(dst, io.LimitReader(c, size), buf); err != nil {
					return
				}
				if _, err := c.Write([]byte{1}); err != nil {
					return
				}
			}
		}()
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return c
	}
	raw, rawSHA := rawPeer(false), rawPeer(true)
	rawCopy := func(c *tls.Conn) time.Duration {
		start := time.Now()
		if _, err := c.Write(data); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}

	var relayTime, rawTime, rawSHATime time.Duration
	var relayCPU, rawCPU time.Duration                        // zero where cpuTime is not available
	best := [3]time.Duration{time.Hour, time.Hour, time.Hour} // relay, raw, rawsha
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		before := [3]time.Duration{relayTime, rawTime, rawSHATime}
		start, cpu0 := time.Now(), cpuTime()
		item := wire.Item{Offer: offer, Open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }}
		if res := sc.DeliverWindow(ctx, []wire.Item{item}, time.Minute); res[0].Err != nil || !res[0].Sent {
			b.Fatalf("deliver: %+v", res[0])
		}
		relayTime += time.Since(start)
		cpu1 := cpuTime()
		relayCPU += cpu1 - cpu0

		rawTime += rawCopy(raw)
		rawCPU += cpuTime() - cpu1
		rawSHATime += rawCopy(rawSHA)
		for k, total := range [3]time.Duration{relayTime, rawTime, rawSHATime} {
			best[k] = min(best[k], total-before[k])
		}
	}
	b.StopTimer()
	mb := float64(size) * float64(b.N) / 1e6
	relayMBps, rawMBps, rawSHAMBps := mb/relayTime.Seconds(), mb/rawTime.Seconds(), mb/rawSHATime.Seconds()
	b.ReportMetric(relayMBps, "relay-MB/s")
	b.ReportMetric(rawMBps, "raw-MB/s")
	b.ReportMetric(rawSHAMBps, "rawsha-MB/s")
	b.ReportMetric(relayMBps/rawMBps, "relay/raw")
	b.ReportMetric(relayMBps/rawSHAMBps, "relay/rawsha")
	if relayCPU > 0 {
		b.ReportMetric(float64(relayCPU.Microseconds())/1e3/float64(b.N), "relay-cpu-ms")
		b.ReportMetric(float64(rawCPU.Microseconds())/1e3/float64(b.N), "raw-cpu-ms")
	}
	// On a shared machine one leg of a round can be slowed by others; the
	// fastest round of each leg is the least disturbed.
	b.ReportMetric(best[1].Seconds()/best[0].Seconds(), "best-relay/raw")
	b.ReportMetric(best[2].Seconds()/best[0].Seconds(), "best-relay/rawsha")
	sc.Close()
	if err := <-recvDone; err != nil {
		b.Fatal(err)
	}
}
