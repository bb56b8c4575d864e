//go:build unix

package emudeploy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/relay-dev/relay/internal/rieproc"
)

// rieEnv is one execution environment: a bootstrap under the AWS Lambda
// Runtime Interface Emulator, in its own process group, invoked over
// HTTP. The emulator runs one invocation at a time and keeps the
// bootstrap warm between them, as Lambda keeps an environment.
type rieEnv struct {
	id     string
	url    string
	proc   *rieproc.Proc
	log    *tailBuffer
	client *http.Client
}

// startRIE runs bootstrap under rie with exactly env (plus PATH and an
// empty HOME, so no AWS config files leak in) and waits until the
// emulator listens.
func startRIE(id, rie, bootstrap, home string, env map[string]string, timeout time.Duration) (*rieEnv, error) {
	log := &tailBuffer{max: 64 << 10}
	p, err := rieproc.Start(rieproc.Config{RIE: rie, Bootstrap: bootstrap, Env: env, Home: home, Timeout: timeout, Output: log})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", id, err)
	}
	return &rieEnv{id: id, url: p.URL, proc: p, log: log,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}}, nil
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
func (e *rieEnv) stop() { e.proc.Stop() }

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
