//go:build unix

// Package rieproc runs a Lambda bootstrap under the AWS Lambda Runtime
// Interface Emulator (the emulator `sam local invoke` runs in Docker) as a
// separate process on 127.0.0.1, for the emulated deployment and the
// emulator tests.
//
// The emulator takes its two listening addresses on the command line and
// cannot be handed a listener, so a port has to be chosen before the
// process binds it. A port chosen from the kernel's ephemeral range (what
// listening on port 0 gives) can be taken in between by any outgoing
// connection of any process on the machine: under a parallel `go test` that
// happened, and the emulator died with "address already in use". So ports
// come from below the ephemeral range, where only listeners that name
// their port live, and an emulator that still loses its port at start-up
// is started again on fresh ones. Ready means both of its servers listen:
// the invocation address accepts connections and the emulator has logged
// that its Runtime API server listens.
package rieproc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Config says what to run and how.
type Config struct {
	// RIE is the emulator binary; Bootstrap the function's binary.
	RIE, Bootstrap string
	// Env is the whole environment of the function, beside PATH, HOME and
	// the settings this package adds (no AWS configuration of the caller
	// leaks in).
	Env map[string]string
	// Home is the process's HOME: an empty directory, so no shared AWS
	// config files are read.
	Home string
	// Timeout is the function timeout the emulator enforces
	// (AWS_LAMBDA_FUNCTION_TIMEOUT, whole seconds; at least 1 s).
	Timeout time.Duration
	// Output receives everything the emulator and the bootstrap write.
	// It is written by one goroutine at a time and may be nil.
	Output io.Writer
	// StartTimeout bounds the wait for the emulator to listen (default 30 s).
	StartTimeout time.Duration
}

// Proc is one running emulator with its bootstrap.
type Proc struct {
	// URL is where the function is invoked (POST, the payload as body).
	URL    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// attempts bounds how often Start picks fresh ports after losing one.
const attempts = 5

// Start runs the bootstrap under the emulator and returns once it is
// ready to be invoked. The process has its own process group, so Stop
// ends the emulator and the bootstrap it started together.
func Start(cfg Config) (*Proc, error) {
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	var lastErr error
	for range attempts {
		p, err := start(cfg)
		if !errors.Is(err, errPortTaken) {
			return p, err
		}
		lastErr = err
	}
	return nil, fmt.Errorf("rieproc: %d attempts: %w", attempts, lastErr)
}

// errPortTaken marks a start that lost one of its ports to another
// process between choosing it and binding it.
var errPortTaken = errors.New("a listening port was taken before the emulator bound it")

func start(cfg Config) (*Proc, error) {
	apiAddr, err := pickAddr()
	if err != nil {
		return nil, err
	}
	rapidAddr, err := pickAddr()
	for err == nil && rapidAddr == apiAddr {
		rapidAddr, err = pickAddr()
	}
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(cfg.RIE, "--log-level", "debug",
		"--runtime-interface-emulator-address", apiAddr, "--runtime-api-address", rapidAddr, cfg.Bootstrap)
	timeout := max(int(cfg.Timeout/time.Second), 1)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + cfg.Home, "AWS_EC2_METADATA_DISABLED=true",
		"AWS_LAMBDA_FUNCTION_TIMEOUT=" + strconv.Itoa(timeout)}
	for k, v := range cfg.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	head := &headBuffer{max: 64 << 10, next: cfg.Output}
	cmd.Stdout, cmd.Stderr = head, head
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("rieproc: start %s: %w", cfg.RIE, err)
	}
	p := &Proc{URL: "http://" + apiAddr + "/2015-03-31/functions/function/invocations", cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	listening := "Runtime API Server listening on " + rapidAddr
	// Another process: poll its port and its log, there is nothing else
	// to wait on.
	deadline := time.Now().Add(cfg.StartTimeout)
	for {
		if strings.Contains(head.String(), listening) {
			if c, err := net.DialTimeout("tcp", apiAddr, time.Second); err == nil {
				c.Close()
				return p, nil
			}
		}
		select {
		case <-p.exited:
			out := head.String()
			if strings.Contains(out, "address already in use") {
				return nil, fmt.Errorf("%w:\n%s", errPortTaken, out)
			}
			return nil, fmt.Errorf("rieproc: the emulator exited before it listened:\n%s", out)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("rieproc: the emulator did not listen on %s and %s within %v:\n%s",
				apiAddr, rapidAddr, cfg.StartTimeout, head.String())
		}
	}
}

// Exited is closed when the emulator has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Stop kills the emulator and its bootstrap and waits for the emulator
// to exit.
func (p *Proc) Stop() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

// pickAddr chooses the emulator's addresses; a test replaces it to hand
// out a port that is already taken.
var pickAddr = freeAddr

// freeAddr is a 127.0.0.1 address whose port was free a moment ago,
// below the ephemeral range when the machine leaves room for that.
func freeAddr() (string, error) {
	lo, hi := quietPorts()
	for range 100 {
		port := 0
		if hi > lo {
			port = lo + rand.IntN(hi-lo)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // in use: pick another
		}
		addr := l.Addr().String()
		l.Close()
		return addr, nil
	}
	return "", errors.New("rieproc: no free port on 127.0.0.1 after 100 tries")
}

// quietPorts is the range [lo, hi) ports are chosen from: from 10000 up to
// the start of the ephemeral range (net.ipv4.ip_local_port_range), or
// empty (port 0) when that leaves fewer than 1000 ports.
func quietPorts() (lo, hi int) {
	lo, hi = 10000, 32768 // Linux's default ephemeral range starts at 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				hi = n
			}
		}
	}
	if hi-lo < 1000 {
		return 0, 0
	}
	return lo, hi
}

// headBuffer keeps the first max bytes written (the emulator's start-up
// lines) and passes everything on to next.
type headBuffer struct {
	mu   sync.Mutex
	max  int
	b    bytes.Buffer
	next io.Writer
}

func (h *headBuffer) Write(p []byte) (int, error) {
	h.mu.Lock()
	if room := h.max - h.b.Len(); room > 0 {
		h.b.Write(p[:min(room, len(p))])
	}
	h.mu.Unlock()
	if h.next != nil {
		return h.next.Write(p)
	}
	return len(p), nil
}

func (h *headBuffer) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.b.String()
}

// Buffer is an Output that keeps everything written, safe to read while
// the process writes (for a test's failure report and its log checks).
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
