package relaycli

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"strings"
	"sync/atomic"

	"github.com/spf13/cobra"

	"github.com/relay-dev/relay/lambda/api"
)

// maxAnswerBytes bounds an operator route's answer read by a --url
// command. The largest is an archive export page (about 2 MiB of rows in
// base64, api.md); the bound only keeps a wrong URL from filling memory.
const maxAnswerBytes = 64 << 20

// serverFlags are the flags of a command that talks to a running relay
// serve (docs/serve.md): its URL and the caller's credentials, a bearer
// token or a client certificate, as backup --url takes them.
type serverFlags struct {
	url, tokenFile, caFile, certFile, keyFile string
}

// register adds the flags to c; who names the principal the command's
// routes need (docs/serve.md, Roles): relay serve's operator routes need
// the operate role, those that answer rows' keys and values (the
// archive's entries and export, the backup) read as well, and the
// takedown routes the takedown role.
func (s *serverFlags) register(c *cobra.Command, who string) {
	fl := c.Flags()
	fl.StringVar(&s.url, "url", "", "base URL of a running relay serve (https://host:7480)")
	fl.StringVar(&s.tokenFile, "token-file", "", "with --url: file holding a bearer token of "+who)
	fl.StringVar(&s.caFile, "ca", "", "with --url: CA certificate (PEM) that signed the server's certificate (default: the system's roots)")
	fl.StringVar(&s.certFile, "cert", "", "with --url: client certificate (PEM) of "+who)
	fl.StringVar(&s.keyFile, "key", "", "with --url: the client certificate's key (PEM)")
}

// credentialsWithoutURL names the credential flags given without --url.
func (s *serverFlags) credentialsWithoutURL() error {
	if s.url == "" && (s.tokenFile != "" || s.caFile != "" || s.certFile != "" || s.keyFile != "") {
		return usageErrorf("--token-file, --ca, --cert and --key go with --url")
	}
	return nil
}

// server is a running relay serve as the CLI calls it.
type server struct {
	base   string // the URL without a trailing slash
	client *http.Client
	token  string // "" when a client certificate (or nothing) authenticates
	hasCA  bool
}

// dial checks the flags and loads the credentials; it sends nothing.
func (s *serverFlags) dial() (*server, error) {
	u, err := url.Parse(s.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, usageErrorf("--url %q: want the server's base URL, https://HOST:PORT", s.url)
	}
	if (s.certFile == "") != (s.keyFile == "") {
		return nil, usageErrorf("--cert and --key go together")
	}
	if s.certFile != "" && s.tokenFile != "" {
		// The server refuses a request with both (401).
		return nil, usageErrorf("give one credential: --token-file or --cert/--key")
	}
	srv := &server{base: strings.TrimSuffix(s.url, "/"), hasCA: s.caFile != ""}
	if s.tokenFile != "" {
		tok, err := os.ReadFile(s.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		srv.token = strings.TrimSpace(string(tok))
		if srv.token == "" {
			return nil, fmt.Errorf("--token-file %s: empty", s.tokenFile)
		}
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS13}
	if s.caFile != "" {
		pem, err := os.ReadFile(s.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca %s: no certificate", s.caFile)
		}
	}
	if s.certFile != "" {
		cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--cert, --key: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	srv.client = &http.Client{
		Transport: &http.Transport{TLSClientConfig: tc, Proxy: http.ProxyFromEnvironment},
		// The server never redirects; following one would send the
		// token (or a POST's action) somewhere the operator did not name.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return srv, nil
}

// newRequest builds a request for path (already escaped) on the server,
// with the caller's token.
func (s *server) newRequest(ctx context.Context, method, path, query string, body []byte) (*http.Request, error) {
	target := s.base + path
	if query != "" {
		target += "?" + query
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return nil, fmt.Errorf("--url: %w", err)
	}
	if body != nil {
		req.Header.Set("content-type", "application/json")
	}
	if s.token != "" {
		req.Header.Set("authorization", "Bearer "+s.token)
	}
	return req, nil
}

// serve sends one API request to the server and returns its answer as the
// in-process handler would. A request that got no answer is a
// *noAnswerError: a POST may or may not have been applied.
func (s *server) serve(ctx context.Context, r api.Request) (api.Response, error) {
	req, err := s.newRequest(ctx, r.Method, r.Path, r.Query, r.Body)
	if err != nil {
		return api.Response{}, err
	}
	for k, v := range r.Headers {
		if k != "content-type" || r.Body != nil {
			req.Header.Set(k, v)
		}
	}
	// Whether the request left in full decides what a lost answer means:
	// before that the server cannot have acted on it.
	var sent atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		WroteRequest: func(i httptrace.WroteRequestInfo) { sent.Store(i.Err == nil) },
	}))
	resp, err := s.client.Do(req)
	if err != nil {
		return api.Response{}, s.noAnswer(r.Method, sent.Load(), err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return api.Response{}, s.noAnswer(r.Method, true, err)
	}
	if len(b) > maxAnswerBytes {
		return api.Response{}, fmt.Errorf("%s: answer over %d bytes", s.base, maxAnswerBytes)
	}
	return api.Response{Status: resp.StatusCode, Body: b}, nil
}

// noAnswerError: a request to the server got no (whole) answer.
type noAnswerError struct {
	base string
	err  error
	// maybeApplied: an action was sent in full, so the server may have
	// applied it.
	maybeApplied bool
	// hint is what to do about it, when the error says.
	hint string
}

func (e *noAnswerError) Error() string {
	msg := fmt.Sprintf("no answer from %s: %v", e.base, e.err)
	if e.hint != "" {
		msg += ": " + e.hint
	}
	if e.maybeApplied {
		msg += " (the request was sent: the action may have been applied; look with relay targets show before repeating it)"
	}
	return msg
}

func (e *noAnswerError) Unwrap() error { return e.err }

func (s *server) noAnswer(method string, sent bool, err error) error {
	e := &noAnswerError{base: s.base, err: err, maybeApplied: sent && method == http.MethodPost}
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok && !s.hasCA {
		e.hint = "give --ca the CA certificate that signed the server's"
	}
	return e
}
