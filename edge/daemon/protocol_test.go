package daemon

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/wire"
)

// logBuffer collects a daemon's log lines for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// receiverB starts node b, which knows a (never reachable: b has nothing
// to send), logging at warn and above into the returned buffer.
func receiverB(t *testing.T) (string, *testNode, *logBuffer) {
	dir := pkitest.New(t, "a", "b")
	relayLn, rpcLn := listen(t), listen(t)
	cfg := nodeConfig(t, dir, "b", relayLn.Addr().String(), rpcLn.Addr().String(),
		[]config.Peer{{ID: "a", Address: "127.0.0.1:1"}})
	logs := &logBuffer{}
	b := startNode(t, cfg, relayLn, rpcLn, func(o *Options) {
		o.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	return dir, b, logs
}

func header(t wire.Type, length uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{byte(t)}, length)
}

// TestProtocolErrorsCounted: framing errors from an authenticated peer
// close the connection, are logged at warn with their reason and counted
// in edged_inbound_protocol_errors_total{reason} (they were a debug line
// and counted nowhere). A SEGMENT of the wrong length is still NACKed.
func TestProtocolErrorsCounted(t *testing.T) {
	dir, b, logs := receiverB(t)
	ctx := context.Background()
	content := []byte("twelve bytes")
	for _, tc := range []struct {
		reason string
		send   func(c *wire.Conn) error
	}{
		{wire.ReasonUnknownType, func(c *wire.Conn) error {
			_, err := c.NetConn().Write(header(wire.TypeWant+1, 0)) // the first type byte not defined
			return err
		}},
		{wire.ReasonTooLarge, func(c *wire.Conn) error {
			_, err := c.NetConn().Write(header(wire.TypeOffer, 1<<20))
			return err
		}},
		{wire.ReasonUnexpectedFrame, func(c *wire.Conn) error {
			return wire.WriteFrame(c.NetConn(), wire.TypeAck, []byte("x"))
		}},
		{wire.ReasonSizeMismatch, func(c *wire.Conn) error {
			if err := c.SendOffer(ctx, offer("short", content)); err != nil {
				return err
			}
			return wire.WriteFrame(c.NetConn(), wire.TypeSegment, content[:5])
		}},
		{wire.ReasonBadMessage, func(c *wire.Conn) error {
			return wire.WriteFrame(c.NetConn(), wire.TypeOffer, []byte(`{"segment_id":"x"}`))
		}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			c := rawSender(t, dir, b)
			if err := tc.send(c); err != nil {
				t.Fatal(err)
			}
			// The receiver closes the connection; a NACK may come first.
			n, err := c.RecvAckOrNack(ctx, "")
			for err == nil {
				if n == nil || n.Code != wire.NackBadRequest {
					t.Fatalf("reply %+v, want NACK bad_request or a close", n)
				}
				n, err = c.RecvAckOrNack(ctx, "")
			}
			waitUntil(t, tc.reason+" counted", func() bool {
				return testMetric(b, `edged_inbound_protocol_errors_total{reason="`+tc.reason+`"} 1`)
			})
			if want := `level=WARN msg="protocol error from peer; closing the connection" node=b peer=a`; !strings.Contains(logs.String(), want) ||
				!strings.Contains(logs.String(), "reason="+tc.reason) {
				t.Errorf("log lacks a warning for %s:\n%s", tc.reason, logs.String())
			}
		})
	}
	if ix, _ := b.client.Index(ctx); len(ix.Segments) != 0 {
		t.Fatalf("stored %+v", ix.Segments)
	}
}

// TestSenderAbortMidSegment: a sender that dies in the middle of a
// SEGMENT (its TCP connection ends without a TLS close) is reported as an
// aborted receive, not as a NACK internal (a receiver failure), and leaves
// nothing stored and no reservation behind.
func TestSenderAbortMidSegment(t *testing.T) {
	dir, b, logs := receiverB(t)
	ctx := context.Background()
	c := rawSender(t, dir, b)
	content := bytes.Repeat([]byte("x"), 100<<10)
	if err := c.SendOffer(ctx, offer("torn", content)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NetConn().Write(append(header(wire.TypeSegment, uint32(len(content))), content[:1000]...)); err != nil {
		t.Fatal(err)
	}
	// What the kernel does for a killed process: FIN, no close_notify.
	c.NetConn().(interface{ NetConn() net.Conn }).NetConn().Close()
	waitUntil(t, "aborted receive counted", func() bool {
		return testMetric(b, `edged_inbound_segments_total{result="aborted"} 1`)
	})
	m, err := b.client.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(m, "edged_nacks_sent_total{") || strings.Contains(m, `result="refused"`) {
		t.Errorf("an aborted sender was NACKed or counted as refused:\n%s", m)
	}
	if !strings.Contains(logs.String(), `msg="peer aborted the segment; nothing stored"`) {
		t.Errorf("log lacks the abort:\n%s", logs.String())
	}
	waitUntil(t, "reservation released", func() bool {
		q, err := b.client.Quota(ctx)
		return err == nil && q.ReservedBytes == 0 && q.ReservedSegments == 0
	})
	if ix, _ := b.client.Index(ctx); len(ix.Segments) != 0 {
		t.Fatalf("stored %+v", ix.Segments)
	}
}

// TestBadHelloCounted: a node that passes TLS but sends a HELLO of another
// protocol version than the one negotiated (none here: version 1) is refused, and counted as a protocol error (version)
// as well as a rejected connection.
func TestBadHelloCounted(t *testing.T) {
	dir, b, logs := receiverB(t)
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "a.crt"), filepath.Join(dir, "a.key"))
	if err != nil {
		t.Fatal(err)
	}
	tc, err := tls.Dial("tcp", b.cfg.Listen, &tls.Config{
		Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13, // only b's reaction matters
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if err := wire.WriteFrame(tc, wire.TypeHello, []byte(`{"version":2,"node_id":"a","window":4}`)); err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, tc) // b's HELLO, then b closes
	waitUntil(t, "version error counted", func() bool {
		return testMetric(b, `edged_inbound_protocol_errors_total{reason="version"} 1`)
	})
	if !strings.Contains(logs.String(), "unsupported protocol version") {
		t.Errorf("log lacks the refusal:\n%s", logs.String())
	}
}
