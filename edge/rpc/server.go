package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/relay-dev/relay/edge/ledger"
	"github.com/relay-dev/relay/edge/segstore"
)

// Backend is what the server exposes. Errors should wrap the sentinels of
// edge/segstore, edge/ledger or ErrBadRequest so that the reply carries
// the right status.
type Backend interface {
	Status(ctx context.Context) (Status, error)
	Index(ctx context.Context) (Index, error)
	Storage(ctx context.Context) (Storage, error)
	Quota(ctx context.Context) (Usage, error)
	// Records lists ledger records in state ("" = every state but acked;
	// "all" = every state).
	Records(ctx context.Context, state string) (Records, error)
	Assurance(ctx context.Context, segment string) (Assurance, error)
	// RetryDeadletter and PurgeDeadletter get a selector that passed
	// Selector.Check.
	RetryDeadletter(ctx context.Context, sel Selector) (Deadlettered, error)
	PurgeDeadletter(ctx context.Context, sel Selector) (Deadlettered, error)
	// Ingest stores size bytes from body, which must hash to sha256hex.
	Ingest(ctx context.Context, id string, size int64, sha256hex string, body io.Reader) (Ingested, error)
	// IngestPath stores the file at path (read by the daemon).
	IngestPath(ctx context.Context, path, id string) (Ingested, error)
	// Resend makes the ledger send a stored segment to a known peer again,
	// whatever its record says (ledger.Resend): the peer lost its copy.
	// A segment not stored, or a peer not in known_peers, is ErrNotFound.
	Resend(ctx context.Context, req ResendRequest) (Resent, error)
	// Takedown evicts a segment for a takedown request and returns its
	// signed receipt (daemon.Daemon.Takedown). A segment neither stored
	// nor evicted is ErrNotFound; a malformed request id ErrBadRequest.
	Takedown(ctx context.Context, req TakedownRequest) (TakedownReply, error)
	// Receipts lists the stored takedown receipts, of one segment or
	// ("") of all.
	Receipts(ctx context.Context, segment string) (Receipts, error)
	// Healthy is nil while the daemon is serving.
	Healthy() error
}

// ErrBadRequest marks a malformed request (400).
var ErrBadRequest = errors.New("bad request")

// ErrForbidden marks a request the daemon's configuration does not allow
// (403), such as ingesting a file outside rpc.ingest_dirs.
var ErrForbidden = errors.New("forbidden")

// ErrNotLocal is returned by Listen for an address reachable from other
// machines.
var ErrNotLocal = errors.New("rpc address is not loopback or a unix socket")

// ErrBodyTimeout means a request body arrived too slowly (408): no bytes
// for ServerOptions.BodyIdleTimeout, or the whole body not within its
// minimum-rate deadline. Nothing was stored; an upload's quota
// reservation was released.
var ErrBodyTimeout = errors.New("request body too slow")

// Default body limits (ServerOptions).
const (
	DefaultBodyIdleTimeout = 30 * time.Second
	DefaultBodyMinRate     = 64 << 10 // bytes per second
)

// ServerOptions bound how long a client may take to send a request body.
// An upload holds a quota reservation (and a temp file) while its body
// arrives, so a client that stalls or trickles must not hold it forever.
type ServerOptions struct {
	// BodyIdleTimeout fails a request whose body makes no progress for
	// this long; default DefaultBodyIdleTimeout.
	BodyIdleTimeout time.Duration
	// BodyMinRate, in bytes per second, sets the whole body's deadline:
	// BodyIdleTimeout + Content-Length / BodyMinRate after the handler
	// starts reading; default DefaultBodyMinRate.
	BodyMinRate int64
}

// Server serves the RPC. Create it with NewServer, then Serve a listener
// from Listen; Shutdown stops it.
type Server struct {
	b   Backend
	log *slog.Logger
	opt ServerOptions
	srv *http.Server
}

// NewServer returns a server for b; metrics come from g (nil: no /metrics).
func NewServer(b Backend, g prometheus.Gatherer, log *slog.Logger, opt ServerOptions) *Server {
	if log == nil {
		log = slog.Default()
	}
	if opt.BodyIdleTimeout <= 0 {
		opt.BodyIdleTimeout = DefaultBodyIdleTimeout
	}
	if opt.BodyMinRate <= 0 {
		opt.BodyMinRate = DefaultBodyMinRate
	}
	s := &Server{b: b, log: log, opt: opt}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", get(s, b.Status))
	mux.HandleFunc("GET /v1/index", get(s, b.Index))
	mux.HandleFunc("GET /v1/storage", get(s, b.Storage))
	mux.HandleFunc("GET /v1/quota", get(s, b.Quota))
	mux.HandleFunc("GET /v1/retry", func(w http.ResponseWriter, r *http.Request) {
		v, err := b.Records(r.Context(), r.URL.Query().Get("state"))
		s.reply(w, r, v, err)
	})
	mux.HandleFunc("GET /v1/deadletter", func(w http.ResponseWriter, r *http.Request) {
		v, err := b.Records(r.Context(), ledger.StateDeadletter.String())
		s.reply(w, r, v, err)
	})
	mux.HandleFunc("GET /v1/assurance", func(w http.ResponseWriter, r *http.Request) {
		seg := r.URL.Query().Get("segment")
		if seg == "" {
			s.reply(w, r, nil, fmt.Errorf("%w: segment parameter required", ErrBadRequest))
			return
		}
		v, err := b.Assurance(r.Context(), seg)
		s.reply(w, r, v, err)
	})
	mux.HandleFunc("POST /v1/deadletter/retry", post(s, b.RetryDeadletter))
	mux.HandleFunc("POST /v1/deadletter/purge", post(s, b.PurgeDeadletter))
	mux.HandleFunc("POST /v1/relay/resend", func(w http.ResponseWriter, r *http.Request) {
		var req ResendRequest
		if err := decodeJSON(s.paced(w, r, maxJSONBody), &req); err != nil {
			s.reply(w, r, nil, err)
			return
		}
		if req.Segment == "" || req.Peer == "" {
			s.reply(w, r, nil, fmt.Errorf(`%w: "segment" and "peer" are both required`, ErrBadRequest))
			return
		}
		v, err := b.Resend(r.Context(), req)
		s.reply(w, r, v, err)
	})
	mux.HandleFunc("POST /v1/takedown/evict", func(w http.ResponseWriter, r *http.Request) {
		var req TakedownRequest
		if err := decodeJSON(s.paced(w, r, maxJSONBody), &req); err != nil {
			s.reply(w, r, nil, err)
			return
		}
		if req.Segment == "" || req.Request == "" {
			s.reply(w, r, nil, fmt.Errorf(`%w: "segment" and "request" are both required`, ErrBadRequest))
			return
		}
		v, err := b.Takedown(r.Context(), req)
		s.reply(w, r, v, err)
	})
	mux.HandleFunc("GET /v1/takedown/receipts", func(w http.ResponseWriter, r *http.Request) {
		v, err := b.Receipts(r.Context(), r.URL.Query().Get("segment"))
		s.reply(w, r, v, err)
	})
	mux.HandleFunc("POST /v1/segments", s.ingest)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := b.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	if g != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}))
	}
	s.srv = &http.Server{Handler: localOnly(jsonMisses(mux)), ReadHeaderTimeout: 10 * time.Second}
	return s
}

// localOnly refuses what a web browser on the same device could send on
// behalf of some web page, since loopback keeps out other machines but
// not browsers: a cross-origin POST (a "simple" text/plain one needs no
// CORS preflight, and would purge or ingest), and any request whose Host
// is not a loopback name (DNS rebinding, which makes a page's requests
// same-origin). edgectl sends no Origin and a loopback Host; a unix socket
// is out of a browser's reach, so its Host is not checked.
func localOnly(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, tcp := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); tcp {
			host, _, err := net.SplitHostPort(r.Host)
			if err != nil {
				host = r.Host
			}
			if !loopbackHost(strings.Trim(host, "[]")) {
				forbidden(w, fmt.Sprintf("Host %q is not a loopback name", r.Host))
				return
			}
		}
		if err := cop.Check(r); err != nil {
			forbidden(w, err.Error())
			return
		}
		next.ServeHTTP(w, r)
	})
}

func forbidden(w http.ResponseWriter, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	json.NewEncoder(w).Encode(ErrorBody{Error: "forbidden: " + msg})
}

// Handler is the server's HTTP handler (for tests with httptest).
func (s *Server) Handler() http.Handler { return s.srv.Handler }

// Serve serves on ln until Shutdown; it returns nil after Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("rpc serve: %w", err)
	}
	return nil
}

// Shutdown stops accepting and waits for requests in progress (bounded by
// ctx).
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

func get[T any](s *Server, f func(context.Context) (T, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := f(r.Context())
		s.reply(w, r, v, err)
	}
}

// maxJSONBody bounds request bodies other than segment uploads.
const maxJSONBody = 64 << 10

func post[T any](s *Server, f func(context.Context, Selector) (T, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var sel Selector
		if err := decodeJSON(s.paced(w, r, maxJSONBody), &sel); err != nil {
			s.reply(w, r, nil, err)
			return
		}
		if err := sel.Check(); err != nil {
			s.reply(w, r, nil, err)
			return
		}
		v, err := f(r.Context(), sel)
		s.reply(w, r, v, err)
	}
}

func decodeJSON(body io.Reader, v any) error {
	dec := json.NewDecoder(io.LimitReader(body, maxJSONBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: body: %v", ErrBadRequest, err)
	}
	return nil
}

func (s *Server) ingest(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Content-Type") == "application/json" {
		var in IngestFile
		if err := decodeJSON(s.paced(w, r, maxJSONBody), &in); err != nil {
			s.reply(w, r, nil, err)
			return
		}
		if in.Path == "" {
			s.reply(w, r, nil, fmt.Errorf("%w: path required", ErrBadRequest))
			return
		}
		v, err := s.b.IngestPath(r.Context(), in.Path, in.ID)
		s.replyStatus(w, r, http.StatusCreated, v, err)
		return
	}
	q := r.URL.Query()
	id, sum := q.Get("id"), q.Get("sha256")
	switch {
	case id == "" || sum == "":
		s.reply(w, r, nil, fmt.Errorf("%w: id and sha256 parameters required", ErrBadRequest))
		return
	case r.ContentLength < 0:
		s.reply(w, r, nil, fmt.Errorf("%w: Content-Length required", ErrBadRequest))
		return
	}
	v, err := s.b.Ingest(r.Context(), id, r.ContentLength, sum, s.paced(w, r, r.ContentLength))
	s.replyStatus(w, r, http.StatusCreated, v, err)
}

// paced returns r's body with the ServerOptions limits applied through
// the connection's read deadline: before each read the deadline becomes
// now + BodyIdleTimeout, but never later than the whole body's deadline
// (BodyIdleTimeout + size/BodyMinRate from now). A read that hits it fails
// with ErrBodyTimeout, which the backend passes on: the store removes its
// temp file and releases the reservation, and the reply is 408.
func (s *Server) paced(w http.ResponseWriter, r *http.Request, size int64) io.Reader {
	budget := s.opt.BodyIdleTimeout
	if size > 0 {
		budget += time.Duration(float64(size) / float64(s.opt.BodyMinRate) * float64(time.Second))
	}
	return &pacedBody{rc: http.NewResponseController(w), body: r.Body, opt: s.opt, end: time.Now().Add(budget)}
}

type pacedBody struct {
	rc   *http.ResponseController
	body io.Reader
	opt  ServerOptions
	end  time.Time
}

func (p *pacedBody) Read(b []byte) (int, error) {
	dl := time.Now().Add(p.opt.BodyIdleTimeout)
	if dl.After(p.end) {
		dl = p.end
	}
	if err := p.rc.SetReadDeadline(dl); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return 0, err
	}
	n, err := p.body.Read(b)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("%w: no progress for %v, or slower than %d bytes/s overall: %w",
			ErrBodyTimeout, p.opt.BodyIdleTimeout, p.opt.BodyMinRate, err)
	}
	return n, err
}

func (s *Server) reply(w http.ResponseWriter, r *http.Request, v any, err error) {
	s.replyStatus(w, r, http.StatusOK, v, err)
}

func (s *Server) replyStatus(w http.ResponseWriter, r *http.Request, code int, v any, err error) {
	if err != nil {
		code = statusOf(err)
		if code >= 500 {
			s.log.Error("rpc failed", "method", r.Method, "path", r.URL.Path, "err", err)
		}
		v = ErrorBody{Error: err.Error()}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// statusOf maps a backend error to an HTTP status.
func statusOf(err error) int {
	switch {
	case errors.Is(err, ErrBadRequest), errors.Is(err, segstore.ErrInvalid), errors.Is(err, ledger.ErrInvalidID),
		errors.Is(err, segstore.ErrChecksum), errors.Is(err, segstore.ErrSize):
		return http.StatusBadRequest
	case errors.Is(err, ledger.ErrNotFound), errors.Is(err, segstore.ErrNotFound), errors.Is(err, os.ErrNotExist):
		return http.StatusNotFound
	case errors.Is(err, ledger.ErrIllegalTransition), errors.Is(err, segstore.ErrDigestConflict), errors.Is(err, segstore.ErrBusy),
		errors.Is(err, segstore.ErrEvicted):
		return http.StatusConflict
	case errors.Is(err, segstore.ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, segstore.ErrQuota):
		return http.StatusInsufficientStorage
	case errors.Is(err, os.ErrPermission), errors.Is(err, ErrForbidden):
		return http.StatusForbidden
	case errors.Is(err, ErrBodyTimeout):
		return http.StatusRequestTimeout
	}
	return http.StatusInternalServerError
}

// Listen opens the RPC listener for an rpc.listen value: "unix:/path" (a
// stale socket file from an earlier run is replaced; the socket is made
// 0660) or a host:port whose host is loopback. Anything else is
// ErrNotLocal.
func Listen(spec string) (net.Listener, error) {
	network, addr := Endpoint(spec)
	if network == "unix" {
		if fi, err := os.Lstat(addr); err == nil && fi.Mode()&os.ModeSocket != 0 {
			// Only a socket is removed: a typo must not delete a file.
			if c, err := net.Dial("unix", addr); err == nil {
				c.Close()
				return nil, fmt.Errorf("rpc listen %s: another process is serving on it", addr)
			}
			os.Remove(addr)
		}
		ln, err := net.Listen("unix", addr)
		if err != nil {
			return nil, fmt.Errorf("rpc listen: %w", err)
		}
		if err := os.Chmod(addr, 0o660); err != nil {
			ln.Close()
			return nil, fmt.Errorf("rpc listen: %w", err)
		}
		return ln, nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("rpc listen %s: %w", addr, err)
	}
	if !loopbackHost(host) {
		return nil, fmt.Errorf("rpc listen %s: %w", addr, ErrNotLocal)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rpc listen: %w", err)
	}
	if ta, ok := ln.Addr().(*net.TCPAddr); !ok || !ta.IP.IsLoopback() {
		ln.Close()
		return nil, fmt.Errorf("rpc listen %s: bound %s: %w", addr, ln.Addr(), ErrNotLocal)
	}
	return ln, nil
}

func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Endpoint splits an address as edge/config's rpc.listen is written into
// a network and an address: ("unix", path) or ("tcp", host:port).
func Endpoint(spec string) (network, address string) {
	if p, ok := strings.CutPrefix(spec, "unix:"); ok {
		return "unix", p
	}
	return "tcp", spec
}

// FormatState normalises a ?state= value: "" and "all" pass, anything
// else must be a ledger state name.
func FormatState(s string) (string, error) {
	if s == "" || s == "all" {
		return s, nil
	}
	st, err := ledger.ParseState(s)
	if err != nil {
		return "", fmt.Errorf("%w: %v (or all)", ErrBadRequest, err)
	}
	return st.String(), nil
}

// jsonMisses answers what mux has no route for (404, or 405 with Allow for
// a path served under another method) with the documented JSON error body
// instead of the mux's plain text.
func jsonMisses(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		miss := &statusOnly{header: http.Header{}, code: http.StatusNotFound}
		h.ServeHTTP(miss, r)
		if allow := miss.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(miss.code)
		json.NewEncoder(w).Encode(ErrorBody{Error: fmt.Sprintf("%s %s: %s", r.Method, r.URL.Path, strings.ToLower(http.StatusText(miss.code)))})
	})
}

// statusOnly keeps the status and headers a handler writes, not its body.
type statusOnly struct {
	header http.Header
	code   int
}

func (s *statusOnly) Header() http.Header         { return s.header }
func (s *statusOnly) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusOnly) WriteHeader(code int)        { s.code = code }
