package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client calls a daemon's RPC. The zero value is not usable; use NewClient.
type Client struct {
	hc   *http.Client
	base string
}

// NewClient returns a client for an rpc.listen value ("unix:/path" or
// host:port).
func NewClient(spec string) *Client {
	network, addr := Endpoint(spec)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		MaxIdleConns:    2,
		IdleConnTimeout: 30 * time.Second,
	}
	host := addr
	if network == "unix" {
		host = "edged" // any name: the dialer ignores it
	}
	return &Client{hc: &http.Client{Transport: tr}, base: "http://" + host}
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Error is a non-2xx reply.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("edged: %s (HTTP %d)", e.Message, e.Status) }

func (c *Client) do(ctx context.Context, method, path string, body io.Reader, size int64, ctype string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if body != nil {
		req.ContentLength = size
		if size == 0 {
			// A 0-byte segment is legal. ContentLength 0 on a non-nil
			// body (an empty *os.File) means "unknown" to net/http,
			// which would send it chunked, and edged requires a
			// Content-Length: NoBody sends "Content-Length: 0".
			req.Body, req.GetBody = http.NoBody, nil
		}
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var eb ErrorBody
		if json.Unmarshal(data, &eb) != nil || eb.Error == "" {
			eb.Error = strings.TrimSpace(string(data))
		}
		return &Error{Status: resp.StatusCode, Message: eb.Error}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode reply: %w", method, path, err)
	}
	return nil
}

func getJSON[T any](ctx context.Context, c *Client, path string) (T, error) {
	var v T
	err := c.do(ctx, http.MethodGet, path, nil, 0, "", &v)
	return v, err
}

func postJSON[T any](ctx context.Context, c *Client, path string, in any) (T, error) {
	var v T
	b, err := json.Marshal(in)
	if err != nil {
		return v, err
	}
	err = c.do(ctx, http.MethodPost, path, bytes.NewReader(b), int64(len(b)), "application/json", &v)
	return v, err
}

// Status is GET /v1/status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	return getJSON[Status](ctx, c, "/v1/status")
}

// Index is GET /v1/index.
func (c *Client) Index(ctx context.Context) (Index, error) {
	return getJSON[Index](ctx, c, "/v1/index")
}

// Storage is GET /v1/storage.
func (c *Client) Storage(ctx context.Context) (Storage, error) {
	return getJSON[Storage](ctx, c, "/v1/storage")
}

// Quota is GET /v1/quota.
func (c *Client) Quota(ctx context.Context) (Usage, error) {
	return getJSON[Usage](ctx, c, "/v1/quota")
}

// Records is GET /v1/retry: state "" is every state but acked, "all" is
// every state.
func (c *Client) Records(ctx context.Context, state string) (Records, error) {
	p := "/v1/retry"
	if state != "" {
		p += "?state=" + url.QueryEscape(state)
	}
	return getJSON[Records](ctx, c, p)
}

// Deadletter is GET /v1/deadletter.
func (c *Client) Deadletter(ctx context.Context) (Records, error) {
	return getJSON[Records](ctx, c, "/v1/deadletter")
}

// Assurance is GET /v1/assurance?segment=.
func (c *Client) Assurance(ctx context.Context, segment string) (Assurance, error) {
	return getJSON[Assurance](ctx, c, "/v1/assurance?segment="+url.QueryEscape(segment))
}

// RetryDeadletter is POST /v1/deadletter/retry.
func (c *Client) RetryDeadletter(ctx context.Context, sel Selector) (Deadlettered, error) {
	return postJSON[Deadlettered](ctx, c, "/v1/deadletter/retry", sel)
}

// PurgeDeadletter is POST /v1/deadletter/purge.
func (c *Client) PurgeDeadletter(ctx context.Context, sel Selector) (Deadlettered, error) {
	return postJSON[Deadlettered](ctx, c, "/v1/deadletter/purge", sel)
}

// Resend is POST /v1/relay/resend.
func (c *Client) Resend(ctx context.Context, req ResendRequest) (Resent, error) {
	return postJSON[Resent](ctx, c, "/v1/relay/resend", req)
}

// Takedown is POST /v1/takedown/evict.
func (c *Client) Takedown(ctx context.Context, req TakedownRequest) (TakedownReply, error) {
	return postJSON[TakedownReply](ctx, c, "/v1/takedown/evict", req)
}

// Receipts is GET /v1/takedown/receipts (segment "" lists all).
func (c *Client) Receipts(ctx context.Context, segment string) (Receipts, error) {
	p := "/v1/takedown/receipts"
	if segment != "" {
		p += "?segment=" + url.QueryEscape(segment)
	}
	return getJSON[Receipts](ctx, c, p)
}

// PutSegment uploads size bytes from body as segment id; sha256hex is the
// content's digest, which the daemon verifies before storing.
func (c *Client) PutSegment(ctx context.Context, id string, size int64, sha256hex string, body io.Reader) (Ingested, error) {
	var v Ingested
	p := "/v1/segments?id=" + url.QueryEscape(id) + "&sha256=" + url.QueryEscape(sha256hex)
	err := c.do(ctx, http.MethodPost, p, body, size, "application/octet-stream", &v)
	return v, err
}

// PutPath asks the daemon to ingest a file it can read itself.
func (c *Client) PutPath(ctx context.Context, path, id string) (Ingested, error) {
	return postJSON[Ingested](ctx, c, "/v1/segments", IngestFile{Path: path, ID: id})
}

// Healthz is GET /healthz: nil when the daemon reports healthy.
func (c *Client) Healthz(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/healthz", nil, 0, "", nil)
}

// Metrics returns GET /metrics as text.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("GET /metrics: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = &Error{Status: resp.StatusCode, Message: strings.TrimSpace(string(b))}
	}
	return string(b), err
}
