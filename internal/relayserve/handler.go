package relayserve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/relay-dev/relay/lambda/api"
)

// Paths the server answers itself, outside the API.
const (
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
	PathMetrics = "/metrics"
	// PathBackup streams a consistent backup of the server's files
	// (internal/relaybackup; operate role).
	PathBackup = "/v1/admin/backup"
)

// httpHandler is the server's HTTP face: it authenticates and authorises
// each request, translates it into an api.Request and answers with what
// api.Handler.Serve returns, the same core the Lambda function runs.
type httpHandler struct {
	api     *api.Handler
	creds   *credentials
	routes  []apiRoute
	maxBody int
	// readTimeout is limits.read_timeout, named in the 408 a slow body
	// gets.
	readTimeout time.Duration
	// answerWithin bounds an API request's work from the request's start
	// (0: unbounded): limits.write_timeout less a margin (answerMargin),
	// so a store that hangs (a stalled network, which no statement_timeout
	// on the server ends) gets the request a 503 while its answer can
	// still be written, rather than a closed connection after an enqueue
	// that may have committed.
	answerWithin time.Duration
	// reads are the body reads in progress, which a drain cuts short.
	reads   bodyReads
	metrics *metrics
	log     *slog.Logger
	ready   func(context.Context) error
	promh   http.Handler
	backup  http.Handler
	// enqueues serialises the enqueues of each source (sourceLocks).
	enqueues sourceLocks
	// slots bound the requests served at once (nil: unbounded) to
	// limits.max_connections, whichever protocol carries them: an HTTP/1.1
	// connection carries one at a time, an HTTP/2 connection up to
	// maxStreamsPerConn, and each request may buffer up to
	// limits.max_body_bytes. The health probes take none.
	slots chan struct{}
	// authenticated, when set, marks the request's connection as having
	// carried an authenticated request (limitListener).
	authenticated func(*http.Request)
}

func newHTTPHandler(h *api.Handler, creds *credentials, maxBody int, m *metrics, log *slog.Logger, ready func(context.Context) error) *httpHandler {
	return &httpHandler{
		api: h, creds: creds, routes: apiRoutes(), maxBody: maxBody, metrics: m, log: log, ready: ready,
		promh: promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}),
	}
}

// statusWriter remembers the status written, for metrics and the log,
// and why a request was refused (the error body's code and message).
type statusWriter struct {
	http.ResponseWriter
	status        int
	code, message string
}

// Unwrap lets http.ResponseController reach the connection (the backup
// lifts its write deadline).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (h *httpHandler) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	start := time.Now()
	h.metrics.inFlight.Inc()
	defer h.metrics.inFlight.Dec()
	w := &statusWriter{ResponseWriter: rw}
	rawPath := r.URL.EscapedPath()
	var c classified
	switch rawPath {
	case PathHealthz, PathReadyz, PathMetrics, PathBackup:
		c = classified{pattern: rawPath, need: needAuthenticated}
	default:
		c = classify(h.routes, r.Method, rawPath)
	}
	caller := h.serve(w, r, rawPath, c)
	code, method := strconv.Itoa(w.status), methodLabel(r.Method)
	h.metrics.requests.WithLabelValues(c.pattern, method, code).Inc()
	elapsed := time.Since(start)
	h.metrics.duration.WithLabelValues(c.pattern, method).Observe(elapsed.Seconds())
	level := slog.LevelDebug
	switch {
	case w.status == http.StatusServiceUnavailable:
		// "Retry soon" (the limit of requests in flight, a shutdown, a
		// contended source), not a fault of the server's: what a busy
		// client can cause is a warning, like a refusal.
		level = slog.LevelWarn
	case w.status >= 500:
		level = slog.LevelError
	case w.status >= 400:
		level = slog.LevelWarn
	}
	attrs := []any{"method", r.Method, "path", rawPath, "route", c.pattern,
		"status", w.status, "caller", caller, "remote", r.RemoteAddr, "ms", elapsed.Milliseconds()}
	if w.code != "" {
		// Why it was refused, as the client was told: the messages name
		// the credential's kind and what was wrong with it (unknown
		// token, expired certificate, missing role), never a token.
		attrs = append(attrs, "error", w.code, "reason", w.message)
	}
	h.log.Log(r.Context(), level, "http request", attrs...)
}

// serve answers one request and returns the caller's name for the log.
func (h *httpHandler) serve(w http.ResponseWriter, r *http.Request, rawPath string, c classified) string {
	start := time.Now()
	// Health needs no credentials: a load balancer or systemd probe has
	// none, and the answer reveals nothing beyond "up" or "not ready".
	switch rawPath {
	case PathHealthz:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		return ""
	case PathReadyz:
		if err := h.ready(r.Context()); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": err.Error()})
			return ""
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
		return ""
	}
	if h.slots != nil {
		select {
		case h.slots <- struct{}{}:
			defer func() { <-h.slots }()
		default:
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, "unavailable", fmt.Sprintf(
				"%d requests are being served, the limit (limits.max_connections); nothing was done: retry after the Retry-After seconds", cap(h.slots)))
			return ""
		}
	}
	// What a web page could make a browser send is refused, whatever the
	// method: API clients send no Origin or Sec-Fetch-Site headers,
	// browsers do, and a cross-origin POST with a text/plain body needs
	// no CORS preflight. A GET is refused too: with a client certificate
	// in the browser (or anonymous access) a page could otherwise make it
	// fetch a backup, whose answer the page cannot read but the request
	// still costs the server a snapshot.
	if why := crossOrigin(r); why != "" {
		writeError(w, http.StatusForbidden, "forbidden", "cross-origin request refused: "+why)
		return ""
	}
	name, roles, aerr := h.creds.auth.Load().authenticate(r)
	if aerr == nil && name == AnonymousPrincipal && !loopbackHostHeader(r.Host) {
		// DNS rebinding: a page whose name now resolves to 127.0.0.1 is
		// same-origin to the browser and needs no credentials here, but
		// its requests name the page's host.
		aerr = forbidden("anonymous requests must name a loopback host, not Host %q", r.Host)
	}
	if aerr == nil && name != AnonymousPrincipal && h.authenticated != nil {
		h.authenticated(r)
	}
	if aerr == nil {
		if rawPath == PathMetrics {
			// Metrics name every source: a read-role matter.
			c.need = needRead
		}
		if rawPath == PathBackup {
			// Every row and target value: operate, and read.
			c.need = needOperateRead
		}
		aerr = authorize(name, roles, c)
	}
	if aerr != nil {
		if aerr.status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="relay"`)
		}
		writeError(w, aerr.status, aerr.code, aerr.message)
		return name
	}
	if rawPath == PathMetrics {
		h.promh.ServeHTTP(w, r)
		return name
	}
	if rawPath == PathBackup {
		h.backup.ServeHTTP(w, r)
		return name
	}

	// The body is bounded before it is read: a declared length over the
	// limit is refused unread, and a body that turns out longer (chunked)
	// is cut at the limit plus one byte. limits.read_timeout bounds how
	// long the client may take to send it.
	if r.ContentLength > int64(h.maxBody) {
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("body is %d bytes, limit %d", r.ContentLength, h.maxBody))
		return name
	}
	rc := http.NewResponseController(w)
	h.reads.start(rc)
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(h.maxBody)+1))
	if h.reads.done(rc) && err != nil {
		writeShuttingDown(w)
		return name
	}
	if err != nil {
		msg := fmt.Sprintf("the body broke off after %d bytes: %v", len(body), err)
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			msg = fmt.Sprintf("the body did not arrive within limits.read_timeout (%v) of the request's start; %d bytes came; nothing was written", h.readTimeout, len(body))
		}
		writeError(w, http.StatusRequestTimeout, "body_incomplete", msg)
		return name
	}
	if len(body) > h.maxBody {
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("body exceeds %d bytes", h.maxBody))
		return name
	}
	headers := make(map[string]string, len(r.Header))
	for k, v := range r.Header {
		headers[strings.ToLower(k)] = strings.Join(v, ",")
	}
	// The credential was judged above; the handler has no use for it, so
	// nothing it logs or answers can carry it.
	delete(headers, "authorization")
	req := api.Request{Method: r.Method, Path: rawPath, Query: r.URL.RawQuery, Headers: headers, Body: body, Caller: name}
	ctx := r.Context()
	if h.answerWithin > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, start.Add(h.answerWithin))
		defer cancel()
	}
	resp, err := h.serveAPI(ctx, c, req)
	if err != nil {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "unavailable", "the request ended while it waited for the enqueues before it to the same source; nothing was written")
		return name
	}
	if resp.Status >= 400 {
		var eb api.ErrorBody
		if json.Unmarshal(resp.Body, &eb) == nil {
			noteRefusal(w, eb.Error.Code, eb.Error.Message)
		}
	}
	for k, v := range resp.Headers {
		w.Header().Set(k, v)
	}
	w.WriteHeader(resp.Status)
	if _, err := w.Write(resp.Body); err != nil && !errors.Is(err, http.ErrHandlerTimeout) {
		h.log.Debug("http response not written", "path", rawPath, "err", err)
	}
	return name
}

// serveAPI runs the API handler; an enqueue first waits for its source's
// turn (sourceLocks), which only the request's end cuts short.
func (h *httpHandler) serveAPI(ctx context.Context, c classified, req api.Request) (api.Response, error) {
	if c.need == needProduce {
		unlock, err := h.enqueues.lock(ctx, c.source)
		if err != nil {
			return api.Response{}, err
		}
		defer unlock()
	}
	return h.api.Serve(ctx, req), nil
}

// writeShuttingDown answers a request whose body the drain cut short:
// nothing was written, and the client should retry once the server is
// back (or elsewhere).
func writeShuttingDown(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "unavailable", "the server is shutting down and the body did not arrive in time; nothing was written: retry")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

// writeError answers in the API's error format (api.ErrorBody), so a
// client handles the server's own refusals like the handler's.
func writeError(w http.ResponseWriter, status int, code, message string) {
	noteRefusal(w, code, message)
	writeJSON(w, status, api.ErrorBody{Error: api.ErrorDetail{Code: code, Message: message}})
}

// noteRefusal keeps an error answer's code and message for the request's
// log line.
func noteRefusal(w http.ResponseWriter, code, message string) {
	if sw, ok := w.(*statusWriter); ok {
		sw.code, sw.message = code, message
	}
}

// crossOrigin says why a request looks sent by a web page of another
// origin, or "" when it does not. The rule is Go's
// http.CrossOriginProtection's, for every method (that one lets GET,
// HEAD and OPTIONS through): a Sec-Fetch-Site other than same-origin or
// none (a person typing the URL) is cross-origin; without that header (an
// older browser), an Origin whose host is not the request's Host is.
func crossOrigin(r *http.Request) string {
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "":
	case "same-origin", "none":
		return ""
	default:
		return fmt.Sprintf("Sec-Fetch-Site is %q", site)
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return ""
	}
	if u, err := url.Parse(origin); err == nil && u.Host == r.Host {
		return ""
	}
	return fmt.Sprintf("Origin %q is not this server (Host %q)", origin, r.Host)
}

// loopbackHostHeader reports whether a Host header names a loopback host.
func loopbackHostHeader(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	return LoopbackHost(strings.Trim(host, "[]"))
}

// methodLabel bounds the method label: a client may send any token as a
// method, and each would be a new series.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead, http.MethodPatch, http.MethodOptions:
		return m
	}
	return "other"
}
