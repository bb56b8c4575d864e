package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relay-dev/relay/edge/rpc"
)

// TestTakedownRefusedAcrossProcesses: b, a real edged, takes down a
// segment a delivered to it. When a offers it again (an operator's
// resend), b refuses it with NACK evicted and a cancels its record: one
// attempt, not retried, not deadlettered, while a goes on delivering
// other segments to b. b's receipts, exported as a receipt file, verify
// offline with only the CA certificate (edgectl takedown verify), and are
// refused with any changed byte, under another CA, or carrying another
// node's certificate.
func TestTakedownRefusedAcrossProcesses(t *testing.T) {
	cl := newCluster(t, "a", "b")
	a, b := cl.nodes["a"], cl.nodes["b"]
	a.start()
	b.start()
	seg := bytes.Repeat([]byte("takedown "), 10_000) // 90 kB: a segment file of its own
	putFile(t, a, "seg-1", seg)
	eventually(t, "seg-1 at b", func() bool { return b.has("seg-1", digest(seg)) })
	eventually(t, "a's record for b acked", a.inState("seg-1", "b", "acked"))

	out := edgectl(t, b.rpc, "takedown", "evict", "seg-1", "--request", "req-1")
	if !strings.Contains(out, "evicted") || !strings.Contains(out, digest(seg)) {
		t.Fatalf("evict output:\n%s", out)
	}
	if b.has("seg-1", digest(seg)) {
		t.Fatal("seg-1 still stored at b")
	}
	if _, err := os.Stat(filepath.Join(cl.dir, "data-b", "segments", "seg-1")); !os.IsNotExist(err) {
		t.Fatalf("segment file left: %v", err)
	}

	before, _ := a.record("seg-1", "b")
	edgectl(t, a.rpc, "relay", "resend", "seg-1", "--peer", "b")
	eventually(t, "a's record for b cancelled", a.inState("seg-1", "b", "cancelled"))
	putFile(t, a, "seg-2", []byte("after the takedown"))
	eventually(t, "seg-2 at b", func() bool { return b.has("seg-2", digest([]byte("after the takedown"))) })
	r, _ := a.record("seg-1", "b")
	if r.Attempts != before.Attempts+1 || !strings.Contains(r.LastError, "evicted") {
		t.Fatalf("a's record: %+v (before the resend: %+v)", r, before)
	}
	if dl := ctlJSON[rpc.Records](t, a, "deadletter", "list"); len(dl.Records) != 0 {
		t.Fatalf("deadlettered: %+v", dl.Records)
	}
	if !strings.Contains(b.log(), "code=evicted") {
		t.Fatal("b's log has no refusal with code evicted")
	}

	checkReceiptFile(t, cl, b, 1)
}

// checkReceiptFile exports n's receipts with edgectl, checks them offline
// with the CA certificate only, and checks that each forgery is refused.
func checkReceiptFile(t *testing.T, cl *cluster, n *node, want int) {
	t.Helper()
	lines := edgectl(t, n.rpc, "takedown", "receipts", "--json-lines")
	if got := strings.Count(lines, "\n"); got != want {
		t.Fatalf("%d receipts, want %d:\n%s", got, want, lines)
	}
	ca := filepath.Join(cl.dir, "pki", "ca.crt")
	write := func(name, content string) string {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if out := edgectl(t, "", "takedown", "verify", write("good.jsonl", lines), "--ca", ca); !strings.Contains(out, "receipts verified") {
		t.Fatalf("verify:\n%s", out)
	}
	other := filepath.Join(t.TempDir(), "other")
	edgectl(t, "", "pki", "init", other)
	certB64 := func(id string) string {
		b, err := os.ReadFile(filepath.Join(cl.dir, "pki", id+".crt"))
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		return base64.StdEncoding.EncodeToString(blk.Bytes)
	}
	someoneElse := "a"
	if n.id == "a" {
		someoneElse = "b"
	}
	i := strings.Index(lines, "node=") + len("node=")
	changed := lines[:i] + "X" + lines[i+1:]
	for _, tc := range []struct{ name, file, ca, want string }{
		{"changed byte", write("changed.jsonl", changed), ca, "REFUSED"},
		{"another CA", write("good.jsonl", lines), filepath.Join(other, "ca.crt"), "not issued by a trusted CA"},
		{"another node's certificate", write("swapped.jsonl", strings.Replace(lines, certB64(n.id), certB64(someoneElse), 1)), ca, "another node's"},
	} {
		out, code := edgectlCode(t, "", "takedown", "verify", tc.file, "--ca", tc.ca)
		if code != 1 || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit %d, output:\n%s\nwant exit 1 and %q", tc.name, code, out, tc.want)
		}
	}
}

// TestTakedownKilledBeforeRemoval: b is killed (SIGKILL, from inside, at
// the fault point kill-unindex) right after its takedown transaction
// committed and before the segment file was removed. After the restart
// the eviction is complete: the file is gone, the tombstone refuses a's
// offer, and the receipt is there, the same one the takedown asked again
// returns, and verifies offline.
func TestTakedownKilledBeforeRemoval(t *testing.T) {
	cl := newCluster(t, "a", "b")
	a, b := cl.nodes["a"], cl.nodes["b"]
	b.faults = filepath.Join(cl.dir, "b-faults")
	a.start()
	b.start()
	seg := bytes.Repeat([]byte("killed "), 12_000)
	putFile(t, a, "seg-1", seg)
	eventually(t, "seg-1 at b", func() bool { return b.has("seg-1", digest(seg)) })
	eventually(t, "a's record for b acked", a.inState("seg-1", "b", "acked"))

	if err := os.WriteFile(b.faults, []byte("kill-unindex"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := edgectlCode(t, b.rpc, "takedown", "evict", "seg-1", "--request", "req-1"); code == 0 {
		t.Fatalf("takedown answered although b was to die first:\n%s", out)
	}
	b.mu.Lock()
	done := b.waitDone
	b.mu.Unlock()
	<-done // b killed itself
	b.kill()
	file := filepath.Join(cl.dir, "data-b", "segments", "seg-1")
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the crash point is after the file's removal: %v", err)
	}
	if err := os.WriteFile(b.faults, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	b.start()
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("segment file left after the restart: %v", err)
	}
	if b.has("seg-1", digest(seg)) {
		t.Fatal("seg-1 indexed after the restart")
	}
	rs := ctlJSON[rpc.Receipts](t, b, "takedown", "receipts")
	if len(rs.Receipts) != 1 || rs.Receipts[0].Request != "req-1" || rs.Receipts[0].SHA256 != digest(seg) {
		t.Fatalf("receipts after the restart: %+v", rs)
	}
	again := ctlJSON[rpc.TakedownReply](t, b, "takedown", "evict", "seg-1", "--request", "req-1")
	if again.Evicted || again.Receipt != rs.Receipts[0].Receipt {
		t.Fatalf("takedown asked again: %+v", again)
	}
	edgectl(t, a.rpc, "relay", "resend", "seg-1", "--peer", "b")
	eventually(t, "a's record for b cancelled", a.inState("seg-1", "b", "cancelled"))
	checkReceiptFile(t, cl, b, 1)
}
