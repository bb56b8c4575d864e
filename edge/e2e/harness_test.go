package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/relay-dev/relay/edge/rpc"
)

// bin holds the edged and edgectl binaries, built once in TestMain.
// edgedFaults is edged built with -tags faultinject, whose segment store
// fails writes on demand (edge/segstore/faultinject.go): only nodes with
// a fault control file run it, every other node runs the production build.
var bin struct{ edged, edgedFaults, edgectl string }

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "edge-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin.edged, bin.edgedFaults, bin.edgectl = filepath.Join(dir, "edged"), filepath.Join(dir, "edged-faults"), filepath.Join(dir, "edgectl")
	for _, b := range []struct{ out, pkg, tags string }{
		{bin.edged, "../../cmd/edged", ""},
		{bin.edgedFaults, "../../cmd/edged", "faultinject"},
		{bin.edgectl, "../../cmd/edgectl", ""},
	} {
		out, pkg := b.out, b.pkg
		args := []string{"build", "-o", out}
		if raceEnabled {
			args = append(args, "-race")
		}
		if b.tags != "" {
			args = append(args, "-tags", b.tags)
		}
		cmd := exec.Command("go", append(args, pkg)...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n", pkg, err)
			return 1
		}
	}
	return m.Run()
}

// waitFor bounds every wait in these tests; polls never sleep for a fixed
// time to "let things happen".
const waitFor = 45 * time.Second

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v", what, waitFor)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freePort returns a loopback address whose port is free now, for an
// agent to bind (see fixedPortRange).
func freePort(t testing.TB) string {
	t.Helper()
	lo, hi := fixedPortRange()
	for range hi - lo {
		port := lo + int(nextPort.Add(1))%(hi-lo)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // in use
		}
		ln.Close()
		return ln.Addr().String()
	}
	t.Fatalf("no free port in %d..%d", lo, hi)
	return ""
}

// nextPort walks the fixed port range; it starts at an offset taken from
// the process id, so two test processes running at once (go test -count
// in parallel shells) start far apart.
var nextPort = func() *atomic.Int64 {
	var n atomic.Int64
	n.Store(int64(os.Getpid()) * 7919)
	return &n
}()

// fixedPortRange is where freePort picks an agent's ports: below the
// kernel's ephemeral range (ip_local_port_range). An agent's port must
// stay the same across restarts, so it is chosen before the agent starts
// and then bound by it; a port from the ephemeral range (listening on
// :0 and closing) could meanwhile be taken as the local port of any
// outgoing connection on the machine, the tests' own included, and the
// agent would fail to start with "address already in use".
func fixedPortRange() (lo, hi int) {
	lo, hi = 20000, 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if f := strings.Fields(string(b)); err == nil && len(f) == 2 {
		if eph, err := strconv.Atoi(f[0]); err == nil && eph > 2048 {
			lo, hi = max(1024, eph-12768), eph
		}
	}
	return lo, hi
}

// cluster is a set of node definitions sharing one dev PKI.
type cluster struct {
	t     testing.TB
	dir   string
	nodes map[string]*node
}

// node is one edged process (restartable).
type node struct {
	c        *cluster
	id       string
	listen   string
	rpc      string // rpc.listen
	peers    []string
	accept   []string          // accept_from: inbound-only peers
	dial     map[string]string // peer → address to dial instead of its listen (a linkem proxy)
	faults   string            // fault control file: run bin.edgedFaults with RELAY_SEGSTORE_FAULTS set to it
	relay    string            // YAML of the relay section, inner lines
	storage  string            // YAML of the storage section, extra lines
	relayAPI string            // YAML of the relay_api section, inner lines; "" leaves it out
	cfgPath  string
	logPath  string
	client   *rpc.Client
	cmd      *exec.Cmd
	waitDone chan struct{}
	mu       sync.Mutex
}

// newCluster issues certificates with the edgectl binary and assigns
// ports; nodes are started separately.
func newCluster(t testing.TB, ids ...string) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), nodes: map[string]*node{}}
	pkiDir := filepath.Join(c.dir, "pki")
	edgectl(t, "", "pki", "init", pkiDir)
	for _, id := range ids {
		edgectl(t, "", "pki", "issue", id, "--usage", "node", "--dir", pkiDir)
	}
	for i, id := range ids {
		n := &node{c: c, id: id, listen: freePort(t), rpc: freePort(t),
			relay: "  backoff: {initial: 50ms, max: 200ms}\n  ack_timeout: 10s\n  dial_timeout: 2s\n  workers: 2\n"}
		if i == 0 {
			// One node uses a unix socket, so both RPC transports are covered.
			n.rpc = "unix:" + filepath.Join(c.dir, id+".sock")
		}
		c.nodes[id] = n
	}
	for _, id := range ids {
		for _, p := range ids {
			if p != id {
				c.nodes[id].peers = append(c.nodes[id].peers, p)
			}
		}
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.stop()
		}
		if t.Failed() {
			for _, id := range ids {
				if b, err := os.ReadFile(c.nodes[id].logPath); err == nil {
					t.Logf("---- %s log ----\n%s", id, logExcerpt(b))
				}
			}
		}
	})
	return c
}

// logExcerpt is what a failed test prints of a node's log: its last 60
// lines and, when the harness had to SIGQUIT a hung process, the whole
// goroutine dump.
func logExcerpt(b []byte) string {
	if i := bytes.LastIndex(b, []byte("SIGQUIT: quit")); i >= 0 {
		return tail(b[:i], 60) + "\n" + string(b[i:])
	}
	return tail(b, 60)
}

func tail(b []byte, lines int) string {
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

func (n *node) writeConfig() {
	t := n.c.t
	var b strings.Builder
	fmt.Fprintf(&b, "node_id: %s\nlisten: %s\n", n.id, n.listen)
	fmt.Fprintf(&b, "tls:\n  cert: pki/%s.crt\n  key: pki/%s.key\n  ca: pki/ca.crt\n", n.id, n.id)
	b.WriteString("known_peers:\n")
	for _, p := range n.peers {
		addr := n.c.nodes[p].listen
		if a, ok := n.dial[p]; ok {
			addr = a
		}
		fmt.Fprintf(&b, "  - {id: %s, address: %q}\n", p, addr)
	}
	if len(n.accept) > 0 {
		fmt.Fprintf(&b, "accept_from: [%s]\n", strings.Join(n.accept, ", "))
	}
	fmt.Fprintf(&b, "relay:\n%s", n.relay)
	fmt.Fprintf(&b, "storage:\n  dir: data-%s\n%s", n.id, n.storage)
	fmt.Fprintf(&b, "rpc:\n  listen: %q\n", n.rpc)
	if n.relayAPI != "" {
		fmt.Fprintf(&b, "relay_api:\n%s", n.relayAPI)
	}
	n.cfgPath = filepath.Join(n.c.dir, n.id+".yaml")
	if err := os.WriteFile(n.cfgPath, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// start runs edged and waits until its RPC reports healthy.
func (n *node) start() {
	t := n.c.t
	t.Helper()
	n.writeConfig()
	n.logPath = filepath.Join(n.c.dir, n.id+".log")
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin.edged, "-config", n.cfgPath, "-log-level", "debug")
	if n.faults != "" {
		cmd = exec.Command(bin.edgedFaults, "-config", n.cfgPath, "-log-level", "debug")
		cmd.Env = append(os.Environ(), "RELAY_SEGSTORE_FAULTS="+n.faults)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(done)
	}()
	n.mu.Lock()
	n.cmd, n.waitDone = cmd, done
	n.mu.Unlock()
	if n.client != nil {
		n.client.Close()
	}
	n.client = rpc.NewClient(n.rpc)
	deadline := time.Now().Add(waitFor)
	for n.client.Healthz(context.Background()) != nil {
		select {
		case <-done:
			b, _ := os.ReadFile(n.logPath)
			t.Fatalf("%s exited at start:\n%s", n.id, tail(b, 30))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not healthy within %v", n.id, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// signal sends sig and, for SIGTERM and SIGKILL, waits for the exit.
func (n *node) signal(sig syscall.Signal) {
	n.mu.Lock()
	cmd, done := n.cmd, n.waitDone
	if sig == syscall.SIGTERM || sig == syscall.SIGKILL {
		n.cmd = nil
	}
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	if sig == syscall.SIGTERM || sig == syscall.SIGKILL {
		select {
		case <-done:
		case <-time.After(waitFor):
			// SIGQUIT first: the Go runtime writes every goroutine's
			// stack to the log (printed with the failure) and exits, so a
			// hang says where it hangs. SIGKILL if even that is stuck.
			cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				<-done
			}
			n.c.t.Errorf("%s did not stop on %v (goroutine dump in its log)", n.id, sig)
		}
	}
}

func (n *node) stop() { n.signal(syscall.SIGTERM) }
func (n *node) kill() { n.signal(syscall.SIGKILL) }

// log returns what the process wrote so far.
func (n *node) log() string {
	b, _ := os.ReadFile(n.logPath)
	return string(b)
}

// edgectl runs the edgectl binary; rpcAddr "" for commands without RPC.
// It fails the test on a non-zero exit and returns stdout.
func edgectl(t testing.TB, rpcAddr string, args ...string) string {
	t.Helper()
	out, code := edgectlCode(t, rpcAddr, args...)
	if code != 0 {
		t.Fatalf("edgectl %v: exit %d\n%s", args, code, out)
	}
	return out
}

func edgectlCode(t testing.TB, rpcAddr string, args ...string) (string, int) {
	t.Helper()
	if rpcAddr != "" {
		args = append([]string{"--rpc", rpcAddr}, args...)
	}
	cmd := exec.Command(bin.edgectl, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), 0
	case errors.As(err, &ee):
		return stdout.String() + stderr.String(), ee.ExitCode()
	}
	t.Fatalf("edgectl %v: %v", args, err)
	return "", -1
}

// ctlJSON runs edgectl --json and decodes its output into T.
func ctlJSON[T any](t testing.TB, n *node, args ...string) T {
	t.Helper()
	var v T
	out := edgectl(t, n.rpc, append([]string{"--json"}, args...)...)
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("edgectl %v: %v\n%s", args, err, out)
	}
	return v
}

// putFile writes content to a file and ingests it on n with edgectl.
func putFile(t testing.TB, n *node, id string, content []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), id)
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	edgectl(t, n.rpc, "segment", "put", path)
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func (n *node) index() []rpc.Segment {
	ix, err := n.client.Index(context.Background())
	if err != nil {
		return nil
	}
	return ix.Segments
}

func (n *node) has(id, sha string) bool {
	return slices.ContainsFunc(n.index(), func(s rpc.Segment) bool { return s.ID == id && s.SHA256 == sha })
}

func (n *node) record(seg, peer string) (rpc.Record, bool) {
	rs, err := n.client.Records(context.Background(), "all")
	if err != nil {
		return rpc.Record{}, false
	}
	for _, r := range rs.Records {
		if r.Segment == seg && r.Peer == peer {
			return r, true
		}
	}
	return rpc.Record{}, false
}

func (n *node) inState(seg, peer, state string) func() bool {
	return func() bool {
		r, ok := n.record(seg, peer)
		return ok && r.State == state
	}
}

// ledgerConsistent checks what must hold of any quiescent ledger: no
// record in flight, and only known peers.
func (n *node) ledgerConsistent(t *testing.T) {
	t.Helper()
	rs, err := n.client.Records(context.Background(), "all")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs.Records {
		if r.State == "inflight" {
			t.Errorf("%s: record in flight at rest: %+v", n.id, r)
		}
		if !slices.Contains(n.peers, r.Peer) {
			t.Errorf("%s: record for unknown peer: %+v", n.id, r)
		}
	}
}
