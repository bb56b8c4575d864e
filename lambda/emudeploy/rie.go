//go:build unix

package emudeploy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// rieEnv is one execution environment: a bootstrap under the AWS Lambda
// Runtime Interface Emulator, in its own process group, invoked over
// HTTP. The emulator runs one invocation at a time and keeps the
// bootstrap warm between them, as Lambda keeps an environment.
type rieEnv struct {
	id     string
	url    string
	cmd    *exec.Cmd
	log    *tailBuffer
	exited chan struct{}
	client *http.Client
}

// startRIE runs bootstrap under rie with exactly env (plus PATH and an
// empty HOME, so no AWS config files leak in) and waits until the
// emulator listens.
func startRIE(id, rie, bootstrap, home string, env map[string]string, timeout time.Duration) (*rieEnv, error) {
	apiAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	rapidAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(rie, "--runtime-interface-emulator-address", apiAddr, "--runtime-api-address", rapidAddr, bootstrap)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "AWS_EC2_METADATA_DISABLED=true",
		fmt.Sprintf("AWS_LAMBDA_FUNCTION_TIMEOUT=%d", int(timeout/time.Second))}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	e := &rieEnv{id: id, url: "http://" + apiAddr + "/2015-03-31/functions/function/invocations", cmd: cmd,
		log: &tailBuffer{max: 64 << 10}, exited: make(chan struct{}),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}}
	cmd.Stdout, cmd.Stderr = e.log, e.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", id, err)
	}
	go func() { _ = cmd.Wait(); close(e.exited) }()
	// Another process: poll its port, there is nothing else to wait on.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", apiAddr, time.Second)
		if err == nil {
			c.Close()
			return e, nil
		}
		select {
		case <-e.exited:
			return nil, fmt.Errorf("%s: emulator exited:\n%s", id, e.log.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			e.stop()
			return nil, fmt.Errorf("%s: emulator not listening on %s: %v", id, apiAddr, err)
		}
	}
}

// Invoke posts payload and returns the handler's answer (a function error
// is an answer with errorMessage).
func (e *rieEnv) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("invoke %s: %w", e.id, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("invoke %s: read: %w", e.id, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("invoke %s: HTTP %d %s", e.id, resp.StatusCode, body)
	}
	return body, nil
}

// stop ends the emulator and its bootstrap together.
func (e *rieEnv) stop() {
	_ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGKILL)
	<-e.exited
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// tailBuffer keeps the last max bytes a process wrote, for error reports.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// Functions lists the relay's Lambda functions by the name a Deployment
// uses, with their main packages (template.yaml, sam.mk).
var Functions = map[string]string{
	"api":   "./functions/api",
	"fire":  "./functions/fire",
	"sweep": "./functions/sweep",
}

// Build compiles each function's bootstrap natively, as rietest does
// (CGO_ENABLED=0, -tags lambda.norpc), from the module at root into dir,
// and returns the binaries by function name.
func Build(root, dir string) (map[string]string, error) {
	out := map[string]string{}
	for name, pkg := range Functions {
		bin := filepath.Join(dir, name, "bootstrap")
		cmd := exec.Command(goTool(), "build", "-tags", "lambda.norpc", "-o", bin, pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build %s: %v\n%s", pkg, err, msg)
		}
		out[name] = bin
	}
	return out, nil
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(os.Getenv("GOROOT"), "bin", "go")
}
