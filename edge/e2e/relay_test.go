package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/pki"
	"github.com/relay-dev/relay/edge/rpc"
	"github.com/relay-dev/relay/edge/transport"
	"github.com/relay-dev/relay/edge/wire"
)

// TestOfferStoreAck: three nodes; a file ingested on a with edgectl is
// stored on b and c, and a's success condition (all_peers) holds.
func TestOfferStoreAck(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "a", "b", "c")
	for _, id := range []string{"a", "b", "c"} {
		c.nodes[id].start()
	}
	a := c.nodes["a"]
	content := bytes.Repeat([]byte("relay me "), 10000)
	putFile(t, a, "report.bin", content)
	for _, id := range []string{"b", "c"} {
		eventually(t, id+" stores report.bin", func() bool { return c.nodes[id].has("report.bin", digest(content)) })
	}
	eventually(t, "assurance met on a", func() bool {
		_, code := edgectlCode(t, a.rpc, "assurance", "report.bin", "--check")
		return code == 0
	})
	as := ctlJSON[rpc.Assurance](t, a, "assurance", "report.bin")
	if !as.Relayed || len(as.AckedPeers) != 2 {
		t.Fatalf("assurance %+v", as)
	}
	if !regexp.MustCompile(`msg="relay success" .*segment=report.bin condition=all_peers acks=2`).MatchString(a.log()) {
		t.Error(`a's log lacks the "relay success" line with condition and ack count`)
	}
	st := ctlJSON[rpc.Status](t, c.nodes["b"], "status")
	if st.Segments != 1 {
		t.Errorf("b status %+v", st)
	}
	for _, n := range c.nodes {
		eventually(t, n.id+" quiescent", func() bool {
			rs, err := n.client.Records(context.Background(), "")
			return err == nil && len(rs.Records) == 0
		})
		n.ledgerConsistent(t)
	}
}

// TestPeerDownThenUp: deliveries to a stopped peer fail and back off;
// once it starts they are acknowledged. a's retry budget outlasts any
// start of b: with the default 10 retries at back-off 50-200 ms it ran
// out 2 s after the first attempt, and under load b once took longer to
// start than that (the record was deadlettered, never acked).
func TestPeerDownThenUp(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "a", "b")
	a, b := c.nodes["a"], c.nodes["b"]
	a.relay += "  max_retries: 1000\n"
	a.start()
	content := []byte("while you were out")
	putFile(t, a, "msg", content)
	eventually(t, "two failed attempts", func() bool {
		r, ok := a.record("msg", "b")
		return ok && r.State == "failed" && r.Attempts >= 2
	})
	b.start()
	eventually(t, "acked after b is up", a.inState("msg", "b", "acked"))
	if !b.has("msg", digest(content)) {
		t.Fatal("b does not hold msg")
	}
}

// TestDeadletterRetry: with b down, max_retries deadletters the record;
// `edgectl deadletter retry` after b is up delivers it.
func TestDeadletterRetry(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "a", "b")
	a, b := c.nodes["a"], c.nodes["b"]
	a.relay = "  max_retries: 2\n  backoff: {initial: 20ms, max: 20ms}\n  dial_timeout: 1s\n"
	a.start()
	putFile(t, a, "dl", []byte("deadletter me"))
	eventually(t, "deadlettered", a.inState("dl", "b", "deadletter"))
	list := ctlJSON[rpc.Records](t, a, "deadletter", "list")
	if len(list.Records) != 1 || list.Records[0].Attempts != 2 || list.Records[0].LastError == "" {
		t.Fatalf("deadletter list %+v", list.Records)
	}
	if out, code := edgectlCode(t, a.rpc, "deadletter", "retry"); code == 0 {
		t.Fatalf("retry without a selector was accepted: %s", out)
	}
	if out, code := edgectlCode(t, a.rpc, "deadletter", "retry", "--peer", "nobody"); code != 1 || !strings.Contains(out, "not in known_peers") {
		t.Fatalf("retry of an unknown peer: exit %d, %q; want exit 1 naming known_peers", code, out)
	}
	b.start()
	out := edgectl(t, a.rpc, "deadletter", "retry", "--peer", "b")
	if !regexp.MustCompile(`retried 1 record\(s\):\n  dl +b +attempts 2 +\S`).MatchString(out) {
		t.Fatalf("retry output %q; want the record dl/b with its attempts and last error", out)
	}
	eventually(t, "acked after retry", a.inState("dl", "b", "acked"))
	r, _ := a.record("dl", "b")
	if r.Attempts != 3 {
		t.Errorf("attempts %d, want 3 (2 before the retry, monotonic)", r.Attempts)
	}
	// Purge removes deadlettered records only; there are none now.
	if out := edgectl(t, a.rpc, "deadletter", "purge", "--all"); !strings.Contains(out, "0 record(s)") {
		t.Errorf("purge output %q", out)
	}
}

// TestQuotaNack: b's quota holds one segment; the second is refused with
// NACK quota and nothing of it is stored.
func TestQuotaNack(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "a", "b")
	a, b := c.nodes["a"], c.nodes["b"]
	b.storage = "  quota_bytes: 10KiB\n  max_segment_bytes: 8KiB\n"
	a.relay = "  backoff: {initial: 1h, max: 1h}\n"
	a.start()
	b.start()
	first, second := bytes.Repeat([]byte("1"), 6<<10), bytes.Repeat([]byte("2"), 6<<10)
	putFile(t, a, "first", first)
	eventually(t, "first acked", a.inState("first", "b", "acked"))
	putFile(t, a, "second", second)
	eventually(t, "second refused", a.inState("second", "b", "failed"))
	r, _ := a.record("second", "b")
	if !strings.Contains(r.LastError, "quota") {
		t.Errorf("LastError %q does not name the quota", r.LastError)
	}
	if ix := b.index(); len(ix) != 1 || ix[0].ID != "first" {
		t.Fatalf("b index %+v", ix)
	}
	q := ctlJSON[rpc.Usage](t, b, "quota")
	if q.Bytes != 6<<10 || q.ReservedBytes != 0 {
		t.Fatalf("b quota %+v", q)
	}
	if disk := onDisk(t, b); len(disk.Segments) != 1 {
		t.Fatalf("b holds %d segments on disk, want 1", len(disk.Segments))
	}
}

// rawTransport speaks for node id with certificates in pkiDir.
func rawTransport(t *testing.T, pkiDir, id string) *transport.Transport {
	return rawTransportVersion(t, pkiDir, id, 0)
}

// rawTransportVersion is rawTransport offering protocol versions up to
// version (0: every version).
func rawTransportVersion(t *testing.T, pkiDir, id string, version int) *transport.Transport {
	t.Helper()
	tr, err := transport.New(transport.Config{
		NodeID: id, CertFile: filepath.Join(pkiDir, id+".crt"), KeyFile: filepath.Join(pkiDir, id+".key"),
		CAFile: filepath.Join(pkiDir, pki.CACertFile), AllowPeer: func(string) bool { return true },
		Wire: wire.Options{Version: version},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestBadDigest: a raw client (with a's valid certificate) sends bytes
// that do not match its offer: NACK checksum, nothing stored, and the
// connection still takes a good segment. Once in each protocol version:
// version 1 (a client restricted to it) and version 2 (pipelined).
func TestBadDigest(t *testing.T) {
	t.Parallel()
	for _, version := range []int{wire.Version1, wire.Version2} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, "a", "b")
			b := c.nodes["b"]
			b.start()
			tr := rawTransportVersion(t, filepath.Join(c.dir, "pki"), "a", version)
			conn, err := tr.Dial(context.Background(), b.listen, "b")
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if conn.Version() != version {
				t.Fatalf("negotiated version %d, want %d", conn.Version(), version)
			}
			ctx := context.Background()
			deliver := func(o wire.Offer, data string) error {
				if version == wire.Version1 {
					return conn.Deliver(ctx, o, strings.NewReader(data))
				}
				item := wire.Item{Offer: o, Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(data)), nil }}
				return conn.DeliverWindow(ctx, []wire.Item{item}, 10*time.Second)[0].Err
			}
			o := wire.Offer{SegmentID: "forged", Size: 5, SHA256: digest([]byte("right"))}
			err = deliver(o, "wrong")
			if ne, ok := err.(*wire.NackError); !ok || ne.Nack.Code != wire.NackChecksum {
				t.Fatalf("deliver of forged bytes: %v, want NACK checksum", err)
			}
			if ix := b.index(); len(ix) != 0 {
				t.Fatalf("b stored %+v", ix)
			}
			good := wire.Offer{SegmentID: "honest", Size: 5, SHA256: digest([]byte("right"))}
			if err := deliver(good, "right"); err != nil {
				t.Fatalf("good segment after a bad one: %v", err)
			}
			eventually(t, "b holds honest", func() bool { return b.has("honest", good.SHA256) })
		})
	}
}

// TestRefusedClients: a certificate from another CA, no certificate, and
// a valid certificate of a node b does not know are all refused, and b
// keeps serving.
func TestRefusedClients(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "a", "b")
	b := c.nodes["b"]
	b.start()
	pkiDir := filepath.Join(c.dir, "pki")
	// mallory: same CA, not in b's known_peers.
	edgectl(t, "", "pki", "issue", "mallory", "--usage", "node", "--dir", pkiDir)
	// A second CA that also issues an "a".
	otherDir := filepath.Join(c.dir, "other-pki")
	edgectl(t, "", "pki", "init", otherDir)
	edgectl(t, "", "pki", "issue", "a", "--usage", "node", "--dir", otherDir)
	ctx := context.Background()

	if _, err := rawTransport(t, otherDir, "a").Dial(ctx, b.listen, "b"); err == nil {
		t.Error("client with a certificate from another CA was accepted")
	}
	if _, err := rawTransport(t, pkiDir, "mallory").Dial(ctx, b.listen, "b"); err == nil {
		t.Error("client of an unknown node was accepted")
	}
	// No certificate at all: a plain TLS 1.3 client.
	tc, err := tls.Dial("tcp", b.listen, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	if err == nil {
		tc.SetDeadline(time.Now().Add(waitFor))
		_, err = tc.Read(make([]byte, 1))
		tc.Close()
	}
	if err == nil {
		t.Error("client without a certificate got data")
	}
	eventually(t, "three rejections counted", func() bool {
		m, err := b.client.Metrics(ctx)
		return err == nil && strings.Contains(m, "edged_inbound_connections_rejected_total 3")
	})
	conn, err := rawTransport(t, pkiDir, "a").Dial(ctx, b.listen, "b")
	if err != nil {
		t.Fatalf("known peer refused after the rejections: %v", err)
	}
	conn.Close()
}

// TestCheckConfigAndReload: -check-config accepts a good file and names
// the bad key of a broken one; SIGHUP reloads certificates.
func TestCheckConfigAndReload(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "a")
	a := c.nodes["a"]
	a.writeConfig()
	out, err := exec.Command(bin.edged, "-check-config", "-config", a.cfgPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		t.Fatalf("check-config: %v\n%s", err, out)
	}
	a.relay = "  success_condition: most\n"
	a.writeConfig()
	out, err = exec.Command(bin.edged, "-check-config", "-config", a.cfgPath).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "relay.success_condition") {
		t.Fatalf("bad config: %v\n%s", err, out)
	}
	a.relay = ""
	a.start()
	edgectl(t, "", "pki", "issue", "a", "--usage", "node", "--dir", filepath.Join(c.dir, "pki"), "--force")
	a.signal(syscall.SIGHUP)
	eventually(t, "reload logged", func() bool { return strings.Contains(a.log(), "certificates reloaded") })
}
