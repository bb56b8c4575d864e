package config

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/relay-dev/relay/edge/wire"
)

// Problem is one invalid setting: the key's dotted path (known_peers[2].id)
// and what is wrong with it.
type Problem struct {
	Key     string
	Message string
}

func (p Problem) String() string { return p.Key + ": " + p.Message }

// Problems is every problem found in one configuration. It is the error
// that Validate, Parse and Load return for an invalid configuration, so a
// caller can list them all (errors.As(err, &probs)).
type Problems []Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.String()
	}
	if len(lines) == 1 {
		return "invalid config: " + lines[0]
	}
	return fmt.Sprintf("invalid config (%d problems):\n  %s", len(ps), strings.Join(lines, "\n  "))
}

func (ps *Problems) add(key, msg string) { *ps = append(*ps, Problem{Key: key, Message: msg}) }

// cover reports whether key is one of ps's keys or lies under one
// (relay under relay, relay.workers under relay, known_peers[1].id under
// known_peers[1]).
func (ps Problems) cover(key string) bool {
	for _, p := range ps {
		if key == p.Key || strings.HasPrefix(key, p.Key+".") || strings.HasPrefix(key, p.Key+"[") {
			return true
		}
	}
	return false
}

// Validate checks every rule and returns Problems listing all violations,
// or nil. It does not touch the filesystem or network: certificate files
// are read, and addresses bound, by the daemon at start-up.
func (c *Config) Validate() error {
	var ps Problems
	if err := checkID(c.NodeID); err != "" {
		ps.add("node_id", err)
	}
	checkHostPort(&ps, "listen", c.Listen, true)
	for _, f := range []struct{ key, val string }{
		{"tls.cert", c.TLS.Cert}, {"tls.key", c.TLS.Key}, {"tls.ca", c.TLS.CA},
	} {
		if f.val == "" {
			ps.add(f.key, "required: path to a PEM file")
		}
	}
	c.validatePeers(&ps)
	c.validateRelay(&ps)
	c.validateStorage(&ps)
	validateRPC(&ps, c.RPC.Listen)
	c.RelayAPI.validate(&ps)
	for i, d := range c.RPC.IngestDirs {
		if strings.TrimSpace(d) == "" {
			ps.add(fmt.Sprintf("rpc.ingest_dirs[%d]", i), "must be a directory path, not empty")
		}
	}
	if len(ps) == 0 {
		return nil
	}
	return ps
}

func (c *Config) validatePeers(ps *Problems) {
	first := map[string]int{}
	for i, p := range c.KnownPeers {
		key := fmt.Sprintf("known_peers[%d]", i)
		if err := checkID(p.ID); err != "" {
			ps.add(key+".id", err)
		} else if p.ID == c.NodeID {
			ps.add(key+".id", fmt.Sprintf("%q is this node's own node_id; a node does not relay to itself", p.ID))
		} else if j, dup := first[p.ID]; dup {
			ps.add(key+".id", fmt.Sprintf("%q duplicates known_peers[%d].id", p.ID, j))
		} else {
			first[p.ID] = i
		}
		checkHostPort(ps, key+".address", p.Address, false)
		if p.Bandwidth < 0 || (p.Bandwidth > 0 && p.Bandwidth < MinBandwidth) {
			ps.add(key+".bandwidth", fmt.Sprintf("%d bytes per second is below the minimum of %s", int64(p.Bandwidth), ByteSize(MinBandwidth)))
		}
	}
	seen := map[string]int{}
	for i, id := range c.AcceptFrom {
		key := fmt.Sprintf("accept_from[%d]", i)
		if err := checkID(id); err != "" {
			ps.add(key, err)
		} else if id == c.NodeID {
			ps.add(key, fmt.Sprintf("%q is this node's own node_id", id))
		} else if j, dup := seen[id]; dup {
			ps.add(key, fmt.Sprintf("%q duplicates accept_from[%d]", id, j))
		} else if j, known := first[id]; known {
			ps.add(key, fmt.Sprintf("%q is known_peers[%d] already; known peers are accepted too, and are also owed segments", id, j))
		} else {
			seen[id] = i
		}
	}
}

func (c *Config) validateRelay(ps *Problems) {
	r := c.Relay
	if r.SuccessCondition != OnePeer && r.SuccessCondition != AllPeers {
		ps.add("relay.success_condition", fmt.Sprintf("%q is not one of %s, %s", r.SuccessCondition, OnePeer, AllPeers))
	}
	if r.MaxRetries < 1 || r.MaxRetries > MaxMaxRetries {
		ps.add("relay.max_retries", fmt.Sprintf("%d is out of range 1..%d", r.MaxRetries, MaxMaxRetries))
	}
	if r.Backoff.Initial <= 0 {
		ps.add("relay.backoff.initial", fmt.Sprintf("%s must be > 0", r.Backoff.Initial))
	}
	if r.Backoff.Max <= 0 {
		ps.add("relay.backoff.max", fmt.Sprintf("%s must be > 0", r.Backoff.Max))
	} else if r.Backoff.Initial > 0 && r.Backoff.Max < r.Backoff.Initial {
		ps.add("relay.backoff.max", fmt.Sprintf("%s is less than relay.backoff.initial (%s)", r.Backoff.Max, r.Backoff.Initial))
	}
	if r.Workers < 1 || r.Workers > MaxWorkers {
		ps.add("relay.workers", fmt.Sprintf("%d is out of range 1..%d", r.Workers, MaxWorkers))
	}
	if r.Window < 1 || r.Window > wire.MaxWindow {
		ps.add("relay.window", fmt.Sprintf("%d is out of range 1..%d", r.Window, wire.MaxWindow))
	}
	if r.PushMaxBytes < 0 || r.PushMaxBytes > wire.MaxPushSize {
		ps.add("relay.push_max_bytes", fmt.Sprintf("%d is out of range 0..%d", r.PushMaxBytes, wire.MaxPushSize))
	}
	if r.MaxProtocolVersion < wire.Version1 || r.MaxProtocolVersion > wire.Version {
		ps.add("relay.max_protocol_version", fmt.Sprintf("%d is out of range %d..%d", r.MaxProtocolVersion, wire.Version1, wire.Version))
	}
	if r.AckTimeout <= 0 {
		ps.add("relay.ack_timeout", fmt.Sprintf("%s must be > 0", r.AckTimeout))
	}
	if r.DialTimeout <= 0 {
		ps.add("relay.dial_timeout", fmt.Sprintf("%s must be > 0", r.DialTimeout))
	}
	for _, b := range []struct {
		key string
		v   Rate
	}{{"relay.bandwidth.total", r.Bandwidth.Total}, {"relay.bandwidth.per_peer", r.Bandwidth.PerPeer}} {
		if b.v < 0 || (b.v > 0 && b.v < MinBandwidth) {
			ps.add(b.key, fmt.Sprintf("%d bytes per second is below the minimum of %s", int64(b.v), ByteSize(MinBandwidth)))
		}
	}
	if r.InboundMinRate < MinBandwidth {
		ps.add("relay.inbound_min_rate", fmt.Sprintf("%d bytes per second is below the minimum of %s", int64(r.InboundMinRate), ByteSize(MinBandwidth)))
	}
	if r.LedgerRetention < MinLedgerRetention {
		ps.add("relay.ledger_retention", fmt.Sprintf("%s is below %s: the records must outlive resends of an evicted segment", r.LedgerRetention, MinLedgerRetention))
	}
}

func (c *Config) validateStorage(ps *Problems) {
	s := c.Storage
	if s.Dir == "" {
		ps.add("storage.dir", "required: directory for segments and the index")
	}
	if s.QuotaBytes <= 0 {
		ps.add("storage.quota_bytes", fmt.Sprintf("%d must be > 0", s.QuotaBytes))
	}
	if s.QuotaSegments <= 0 {
		ps.add("storage.quota_segments", fmt.Sprintf("%d must be > 0", s.QuotaSegments))
	}
	if s.VerifyOnStart != VerifyAlways && s.VerifyOnStart != VerifyUncleanStop && s.VerifyOnStart != VerifyNever {
		ps.add("storage.verify_on_start", fmt.Sprintf("%q is not one of %s, %s, %s", s.VerifyOnStart, VerifyAlways, VerifyUncleanStop, VerifyNever))
	}
	if s.OnFull != OnFullReject && s.OnFull != OnFullEvictRelayedOldest {
		ps.add("storage.on_full", fmt.Sprintf("%q is not one of %s, %s", s.OnFull, OnFullReject, OnFullEvictRelayedOldest))
	}
	if s.PeerReservePercent < 1 || s.PeerReservePercent > 100 {
		ps.add("storage.peer_reserve_percent", fmt.Sprintf("%d is out of range 1..100", s.PeerReservePercent))
	}
	if s.ScrubInterval < 0 {
		ps.add("storage.scrub_interval", fmt.Sprintf("%v must be >= 0 (0 turns the scrub off)", s.ScrubInterval))
	}
	if s.ScrubRate <= 0 {
		ps.add("storage.scrub_rate", fmt.Sprintf("%d must be > 0 bytes per second", s.ScrubRate))
	}
	if s.PackMaxBytes < 0 || s.PackMaxBytes > MaxPackMaxBytes {
		ps.add("storage.pack_max_bytes", fmt.Sprintf("%d is out of range 0..%d", s.PackMaxBytes, int64(MaxPackMaxBytes)))
	}
	if s.ReceiveMemoryBytes < MinReceiveMemory || s.ReceiveMemoryBytes > MaxReceiveMemory {
		ps.add("storage.receive_memory_bytes", fmt.Sprintf("%s is out of range %s..%s", s.ReceiveMemoryBytes, ByteSize(MinReceiveMemory), ByteSize(MaxReceiveMemory)))
	}
	switch {
	case s.MaxSegmentBytes <= 0:
		ps.add("storage.max_segment_bytes", fmt.Sprintf("%d must be > 0", s.MaxSegmentBytes))
	case s.MaxSegmentBytes > MaxSegmentLimit:
		ps.add("storage.max_segment_bytes", fmt.Sprintf("%s exceeds the wire limit of %d bytes (4-byte frame length)", s.MaxSegmentBytes, int64(MaxSegmentLimit)))
	case s.QuotaBytes > 0 && s.MaxSegmentBytes > s.QuotaBytes:
		ps.add("storage.max_segment_bytes", fmt.Sprintf("%s exceeds storage.quota_bytes (%s)", s.MaxSegmentBytes, s.QuotaBytes))
	}
}

func validateRPC(ps *Problems, listen string) {
	const key = "rpc.listen"
	if p, ok := strings.CutPrefix(listen, unixPrefix); ok {
		if p == "" {
			ps.add(key, "unix: needs a socket path (unix:/run/edged/rpc.sock)")
		} else if strings.HasPrefix(p, "@") {
			ps.add(key, fmt.Sprintf("%q: abstract unix sockets are not supported", listen))
		}
		return
	}
	host, ok := checkHostPort(ps, key, listen, false)
	if !ok {
		return
	}
	if host == "localhost" {
		return
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		ps.add(key, fmt.Sprintf("%q is not a loopback address; the RPC has no authentication, use 127.0.0.1:PORT, [::1]:PORT, localhost:PORT or unix:/path", listen))
	}
}

// checkHostPort reports a problem unless addr is host:port with a port in
// 1..65535. An empty host (":7400", all interfaces) is allowed only when
// emptyHostOK. It returns the host and whether addr was well formed.
func checkHostPort(ps *Problems, key, addr string, emptyHostOK bool) (string, bool) {
	if addr == "" {
		ps.add(key, "required: host:port")
		return "", false
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		ps.add(key, fmt.Sprintf("%q is not host:port", addr))
		return "", false
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		ps.add(key, fmt.Sprintf("%q: port must be a number in 1..65535", addr))
		return "", false
	}
	if host == "" && !emptyHostOK {
		ps.add(key, fmt.Sprintf("%q has no host", addr))
		return "", false
	}
	return host, true
}

// checkID returns why id is not a valid node id, or "".
func checkID(id string) string {
	if id == "" {
		return "required: a node id (letters, digits, '.', '-', '_')"
	}
	if len(id) > MaxIDLen {
		return fmt.Sprintf("%q is longer than %d bytes", id, MaxIDLen)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_') {
			return fmt.Sprintf("%q contains %q; use letters, digits, '.', '-', '_'", id, r)
		}
	}
	if id[0] == '.' || id[0] == '-' {
		return fmt.Sprintf("%q must not start with '.' or '-'", id)
	}
	// The wire's rule is the authority (HELLO and certificates carry the
	// id); the checks above only word its failures for a config file.
	if err := wire.CheckNodeID(id); err != nil {
		return err.Error()
	}
	return ""
}

func (r RelayAPI) validate(ps *Problems) {
	if r.URL == "" {
		for _, f := range []struct{ key, val string }{{"relay_api.ca", r.CA}, {"relay_api.region", r.Region}} {
			if f.val != "" {
				ps.add(f.key, "set without relay_api.url, which turns the relay API on")
			}
		}
	} else if u, err := url.Parse(r.URL); err != nil {
		ps.add("relay_api.url", fmt.Sprintf("%q is not a URL: %v", r.URL, err))
	} else {
		switch {
		case u.Scheme != "https":
			ps.add("relay_api.url", fmt.Sprintf("%q: must be https:// (holdings, orders and receipts travel over TLS)", r.URL))
		case u.Host == "" || u.Hostname() == "":
			ps.add("relay_api.url", fmt.Sprintf("%q has no host", r.URL))
		case u.User != nil:
			ps.add("relay_api.url", fmt.Sprintf("%q carries credentials; the node authenticates with relay_api.auth", r.URL))
		case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
			ps.add("relay_api.url", fmt.Sprintf("%q: a base URL has no query or fragment", r.URL))
		}
	}
	switch r.Auth {
	case AuthMTLS:
		if r.Region != "" {
			ps.add("relay_api.region", "only with relay_api.auth: sigv4")
		}
	case AuthSigV4:
		if r.Region == "" {
			ps.add("relay_api.region", "required with relay_api.auth: sigv4 (the function URL's region, us-east-1)")
		}
	default:
		ps.add("relay_api.auth", fmt.Sprintf("%q is not one of %s, %s", r.Auth, AuthMTLS, AuthSigV4))
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"relay_api.report_interval", r.ReportInterval}, {"relay_api.order_interval", r.OrderInterval},
		{"relay_api.timeout", r.Timeout}, {"relay_api.backoff.initial", r.Backoff.Initial}} {
		if d.v <= 0 {
			ps.add(d.key, fmt.Sprintf("%s must be > 0", d.v))
		}
	}
	if r.ReportDelay < 0 {
		ps.add("relay_api.report_delay", fmt.Sprintf("%s must be >= 0", r.ReportDelay))
	}
	if r.Backoff.Max <= 0 {
		ps.add("relay_api.backoff.max", fmt.Sprintf("%s must be > 0", r.Backoff.Max))
	} else if r.Backoff.Initial > 0 && r.Backoff.Max < r.Backoff.Initial {
		ps.add("relay_api.backoff.max", fmt.Sprintf("%s is less than relay_api.backoff.initial (%s)", r.Backoff.Max, r.Backoff.Initial))
	}
	if r.Batch < 1 || r.Batch > MaxRelayAPIBatch {
		ps.add("relay_api.batch", fmt.Sprintf("%d is out of range 1..%d", r.Batch, MaxRelayAPIBatch))
	}
}
