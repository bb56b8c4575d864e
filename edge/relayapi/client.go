package relayapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/relay-dev/relay/edge/config"
)

// maxAnswerBytes bounds what the client reads of an answer: a page of 500
// orders is about 250 KiB.
const maxAnswerBytes = 4 << 20

// maxBodyBytes is the relay's bound on a request body (the contract).
const maxBodyBytes = 1 << 20

// Signer signs a request before it is sent; body is its payload. SigV4
// (NewSigV4) is the only one: mutual TLS needs no signature.
type Signer interface {
	Sign(ctx context.Context, r *http.Request, body []byte) error
}

// NewHTTPClient is the HTTP client for cfg: TLS 1.2 or later, the server
// verified against relay_api.ca (or the system roots), and with auth mtls
// the node's certificate presented, asked of clientCert at each handshake
// so a renewed certificate is used without a restart. Proxies come from
// the environment (HTTPS_PROXY, NO_PROXY), as devices behind one need.
func NewHTTPClient(cfg config.RelayAPI, clientCert func() *tls.Certificate) (*http.Client, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CA != "" {
		pem, err := os.ReadFile(cfg.CA)
		if err != nil {
			return nil, config.Problems{{Key: "relay_api.ca", Message: err.Error()}}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, config.Problems{{Key: "relay_api.ca", Message: cfg.CA + ": no PEM certificate in it"}}
		}
		tc.RootCAs = pool
	}
	if cfg.Auth == config.AuthMTLS {
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return clientCert(), nil }
	}
	tr := &http.Transport{
		Proxy: http.ProxyFromEnvironment, TLSClientConfig: tc, ForceAttemptHTTP2: true,
		MaxIdleConns: 2, IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: 10 * time.Second,
		ResponseHeaderTimeout: cfg.Timeout,
	}
	return &http.Client{Transport: tr, Timeout: cfg.Timeout,
		// A redirect would take the credentials elsewhere; the API has none.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}, nil
}

// NewSigV4 signs with AWS Signature Version 4 for a Lambda function URL
// (service lambda) in region, with credentials from the default chain
// (defaultCredentials: the environment, the shared files, the container's
// or the instance's role), cached and refreshed. It returns where the
// credentials come from, for the log; they are first retrieved with the
// first request.
func NewSigV4(region string) (Signer, string, error) {
	creds, source, err := defaultCredentials()
	if err != nil {
		return nil, "", fmt.Errorf("relay_api: aws credentials: %w", err)
	}
	return &sigV4{creds: creds, region: region, signer: v4.NewSigner(), now: time.Now}, source, nil
}

type sigV4 struct {
	creds  aws.CredentialsProvider
	region string
	signer *v4.Signer
	now    func() time.Time
}

func (s *sigV4) Sign(ctx context.Context, r *http.Request, body []byte) error {
	if s.creds == nil {
		return errors.New("sign request: no AWS credentials found")
	}
	creds, err := s.creds.Retrieve(ctx)
	if err != nil {
		return fmt.Errorf("sign request: %w", err)
	}
	sum := sha256.Sum256(body)
	return s.signer.SignHTTP(ctx, creds, r, hex.EncodeToString(sum[:]), "lambda", s.region, s.now())
}

// apiError is an answer other than 2xx, or one the client cannot use.
type apiError struct {
	Status  int    // 0: no answer (network, timeout) or an unusable 2xx
	Code    string // the problem body's error.code, if any
	Message string
	// Refused marks a 200 answer this node must not act on (it names
	// another node): a verdict, not retried as is.
	Refused bool
}

func (e *apiError) Error() string {
	switch {
	case e.Status == 0:
		return e.Message
	case e.Code != "":
		return fmt.Sprintf("relay answered %d %s: %s", e.Status, e.Code, e.Message)
	}
	return fmt.Sprintf("relay answered %d: %s", e.Status, e.Message)
}

// retryable reports whether the same request may succeed later: no
// answer, a server error, or a request the relay asked to come back with
// (408, 429). Any other 4xx is the relay's verdict on this request.
func retryable(err error) bool {
	var ae *apiError
	if !errors.As(err, &ae) {
		return true // local: a transaction, a certificate, credentials
	}
	if ae.Refused {
		return false
	}
	return ae.Status == 0 || ae.Status >= 500 || ae.Status == http.StatusRequestTimeout || ae.Status == http.StatusTooManyRequests
}

// client makes the API's requests.
type client struct {
	base      string // without a trailing slash
	http      *http.Client
	sign      Signer
	userAgent string
}

// do sends one request and decodes a 200 answer's JSON into out. Every
// failure is an *apiError, except a signing failure.
func (c *client) do(ctx context.Context, method, path string, header http.Header, body []byte, out any) error {
	r, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return &apiError{Message: err.Error()}
	}
	if body == nil {
		r.Body, r.ContentLength = http.NoBody, 0
	} else {
		r.Header.Set("Content-Type", "application/json")
	}
	r.Header.Set("Accept", "application/json")
	r.Header.Set("User-Agent", c.userAgent)
	for k, vs := range header {
		r.Header[k] = vs
	}
	if c.sign != nil {
		if err := c.sign.Sign(ctx, r, body); err != nil {
			return err
		}
	}
	resp, err := c.http.Do(r)
	if err != nil {
		return &apiError{Message: fmt.Sprintf("%s %s: %v", method, path, err)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return &apiError{Message: fmt.Sprintf("%s %s: reading the answer: %v", method, path, err)}
	}
	if len(b) > maxAnswerBytes {
		return &apiError{Message: fmt.Sprintf("%s %s: answer over %d bytes", method, path, maxAnswerBytes)}
	}
	if resp.StatusCode != http.StatusOK {
		return problem(resp.StatusCode, b)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/json" {
		return &apiError{Message: fmt.Sprintf("%s %s: answer is %q, not application/json", method, path, resp.Header.Get("Content-Type"))}
	}
	if err := json.Unmarshal(b, out); err != nil {
		return &apiError{Message: fmt.Sprintf("%s %s: answer: %v", method, path, err)}
	}
	return nil
}

// problem reads the API's {"error":{"code","message"}} body, or quotes
// the start of whatever else came (a proxy's page).
func problem(status int, b []byte) error {
	var p struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if json.Unmarshal(b, &p) == nil && p.Error.Code != "" {
		return &apiError{Status: status, Code: p.Error.Code, Message: p.Error.Message}
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return &apiError{Status: status, Message: s}
}
