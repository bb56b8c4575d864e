// Package servetest runs the real `relay serve` binary for tests: Build
// compiles cmd/relay once (in TestMain), Start runs it as a separate
// process with a configuration file and returns once it listens, with the
// address it bound (listen port 0 works: the address comes from the
// server's --ready-file, whatever its log_level). The process's JSON log
// is kept and printed when the test fails.
//
//	func TestMain(m *testing.M) {
//		dir, _ := os.MkdirTemp("", "relay-bin-")
//		bin, err := servetest.Build(dir)
//		... code := m.Run(); os.RemoveAll(dir); os.Exit(code)
//	}
//	p := servetest.Start(t, bin, servetest.WriteConfig(t, yaml))
//	resp, _ := p.Client(nil).Post(p.URL+"/v1/sources/orders/rows", ...)
//	p.Stop(t) // SIGTERM, wait, exit code
package servetest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// StartTimeout bounds the wait for a server to listen (a -race binary on
// two busy cores can be slow to start); it is a hang guard, not a timing
// assertion.
const StartTimeout = 60 * time.Second

// Build compiles cmd/relay into dir (with -race when the tests run with
// it) and returns the binary's path.
func Build(dir string) (string, error) {
	out := filepath.Join(dir, "relay")
	args := []string{"build", "-o", out}
	if RaceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "github.com/relay-dev/relay/cmd/relay")...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build relay: %v\n%s", err, buf.Bytes())
	}
	return out, nil
}

// Main is a TestMain body for packages that run the relay binary: it
// builds it once into a temp directory, sets *bin to its path, runs the
// tests and removes the directory; the result is the exit code.
func Main(m *testing.M, bin *string) int {
	dir, err := os.MkdirTemp("", "relay-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if *bin, err = Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// WriteConfig writes yaml to a file in a new temp directory and returns
// its path (relative paths in it resolve against that directory).
func WriteConfig(t testing.TB, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Proc is a running `relay serve`.
type Proc struct {
	// Addr is the bound host:port; URL is scheme://Addr.
	Addr, URL string

	cmd  *exec.Cmd
	done chan struct{} // closed when the process exited and its log is read

	mu      sync.Mutex
	log     bytes.Buffer
	changed chan struct{} // closed and replaced when a log line arrives
	exitErr error
}

// Start runs `relay serve --config configPath --ready-file <temp>` and
// waits until it listens. The process is killed when the test ends if still running.
func Start(t testing.TB, bin, configPath string, extraArgs ...string) *Proc {
	t.Helper()
	p := &Proc{done: make(chan struct{}), changed: make(chan struct{})}
	readyFile := filepath.Join(t.TempDir(), "ready.json")
	p.cmd = exec.Command(bin, append([]string{"serve", "--config", configPath, "--ready-file", readyFile}, extraArgs...)...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = io.Discard
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.log.Write(sc.Bytes())
			p.log.WriteByte('\n')
			close(p.changed)
			p.changed = make(chan struct{})
			p.mu.Unlock()
		}
		err := p.cmd.Wait()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("relay serve log (%s):\n%s", configPath, p.Log())
		}
	})
	// The ready file appears (atomically, by rename) once the server
	// listens; polled, with StartTimeout as the hang guard.
	deadline := time.Now().Add(StartTimeout)
	for {
		b, err := os.ReadFile(readyFile)
		if err == nil {
			var l struct{ Addr, URL string }
			if err := json.Unmarshal(b, &l); err != nil || l.Addr == "" {
				t.Fatalf("ready file %q: %v", b, err)
			}
			p.Addr, p.URL = l.Addr, l.URL
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("relay serve exited (%v) before it was ready:\n%s", p.exitErr, p.Log())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay serve not ready within %v:\n%s", StartTimeout, p.Log())
		}
	}
}

// Log returns the process's log so far.
func (p *Proc) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// WaitLog waits for a log line whose "msg" is msg and returns it. It
// fails the test if the process exits first or StartTimeout passes.
func (p *Proc) WaitLog(t testing.TB, msg string) string {
	t.Helper()
	return p.WaitLogN(t, msg, 1)
}

// WaitLogN waits for the nth log line (counting from 1) whose "msg" is
// msg and returns it: what a test that makes the server log the same
// message again (a second SIGHUP) waits for.
func (p *Proc) WaitLogN(t testing.TB, msg string, n int) string {
	t.Helper()
	deadline := time.NewTimer(StartTimeout)
	defer deadline.Stop()
	want := fmt.Sprintf(`"msg":%q`, msg)
	seen, found := 0, 0
	for {
		p.mu.Lock()
		text := p.log.String()
		changed := p.changed
		p.mu.Unlock()
		// Only whole lines are counted, so none is counted twice.
		end := strings.LastIndexByte(text, '\n') + 1
		for line := range strings.SplitSeq(text[seen:end], "\n") {
			if strings.Contains(line, want) {
				if found++; found == n {
					return line
				}
			}
		}
		seen = end
		select {
		case <-changed:
		case <-p.done:
			if strings.Contains(p.Log()[seen:], want) {
				continue
			}
			t.Fatalf("relay serve exited (%v) before logging %q (%d times):\n%s", p.exitErr, msg, n, p.Log())
		case <-deadline.C:
			t.Fatalf("relay serve did not log %q (%d times) within %v:\n%s", msg, n, StartTimeout, p.Log())
		}
	}
}

// Signal sends sig to the process.
func (p *Proc) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// Wait waits for the process to exit and returns its exit code (-1: killed
// by a signal).
func (p *Proc) Wait(t testing.TB) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(StartTimeout):
		t.Fatalf("relay serve did not exit within %v:\n%s", StartTimeout, p.Log())
	}
	return p.cmd.ProcessState.ExitCode()
}

// CPU is the user and system CPU time the process used, once it has
// exited (0 before).
func (p *Proc) CPU() time.Duration {
	select {
	case <-p.done:
		return p.cmd.ProcessState.UserTime() + p.cmd.ProcessState.SystemTime()
	default:
		return 0
	}
}

// Stop sends SIGTERM and returns the exit code.
func (p *Proc) Stop(t testing.TB) int {
	t.Helper()
	p.Signal(t, syscall.SIGTERM)
	return p.Wait(t)
}

// Kill sends SIGKILL (no drain) and waits for the process to go.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	p.Signal(t, syscall.SIGKILL)
	p.Wait(t)
}

// Client returns an HTTP client for the server. tc is its TLS
// configuration (nil: plain HTTP). Each call makes a new transport, so
// clients do not share connections.
func (p *Proc) Client(tc *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: StartTimeout}
}

// ClientTLS is a TLS 1.3 client configuration trusting the CA in caFile,
// presenting the certificate in certFile/keyFile when both are set.
func ClientTLS(t testing.TB, caFile, certFile, keyFile string) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("%s: no certificate", caFile)
	}
	tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc
}

// WaitReady polls GET /readyz until it answers 200; the deadline is a
// hang guard.
func (p *Proc) WaitReady(t testing.TB, c *http.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", p.URL+"/readyz", nil)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("relay serve not ready within %v (last: %v)", StartTimeout, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
