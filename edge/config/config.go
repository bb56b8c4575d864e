// Package config reads and validates the edge agent's YAML configuration.
//
// A configuration is decoded over Default(), so a key that is absent keeps
// its documented default while a key that is present, even with a zero
// value, is taken as written and validated (quota_bytes: 0 is refused, not
// silently replaced). Unknown keys are refused with their full dotted path,
// because a misspelt key that is silently ignored (evict_on_relays: true)
// is the kind of mistake an operator only finds after the disk fills.
//
// Relative file paths (tls.cert, tls.key, tls.ca, storage.dir, relay_api.ca
// and a unix rpc.listen socket) are resolved against the directory of the config file
// by Load, so a config works the same whatever directory edged starts in.
// Parse, which has no file, leaves them as written.
//
// The reference with every key and default is docs/edge-config.md.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/relay-dev/relay/edge/wire"
)

// Success conditions for relay.success_condition.
const (
	// OnePeer: a segment is relayed once any one required peer acknowledged it.
	OnePeer = "one_peer"
	// AllPeers: a segment is relayed once every required peer acknowledged it.
	AllPeers = "all_peers"
)

// Policies for storage.on_full.
const (
	// OnFullReject refuses what does not fit (NACK quota, HTTP 507).
	OnFullReject = "reject"
	// OnFullEvictRelayedOldest evicts relayed segments that are owed to no
	// one, oldest received first, to make room; what is still owed stays.
	OnFullEvictRelayedOldest = "evict_relayed_oldest"
)

// Values of storage.verify_on_start.
const (
	VerifyAlways      = "always"
	VerifyUncleanStop = "unclean_stop"
	VerifyNever       = "never"
)

// Defaults. They are exported so the daemon's -check-config output and the
// documentation can quote them; docs/edge-config.md lists the same values
// and TestDefaultsDocumented keeps the two in step.
const (
	DefaultListen           = ":7400"
	DefaultRPCListen        = "127.0.0.1:7401"
	DefaultSuccessCondition = AllPeers
	DefaultMaxRetries       = 10
	DefaultBackoffInitial   = time.Second
	DefaultBackoffMax       = 5 * time.Minute
	DefaultWorkers          = 4
	DefaultAckTimeout       = 30 * time.Second
	DefaultWindow           = 256
	DefaultProtocolVersion  = wire.Version     // 5
	DefaultPushMaxBytes     = wire.MaxPushSize // 64 KiB
	DefaultDialTimeout      = 10 * time.Second
	DefaultInboundMinRate   = 16 << 10 // 16 KiB/s
	DefaultLedgerRetention  = 7 * 24 * time.Hour
	DefaultQuotaBytes       = 1 << 30 // 1 GiB
	DefaultQuotaSegments    = 10000
	DefaultMaxSegmentBytes  = 64 << 20 // 64 MiB
	DefaultPackMaxBytes     = 64 << 10 // 64 KiB
	DefaultPeerReservePct   = 25
	MaxPackMaxBytes         = 1 << 20 // 1 MiB: packed segments wait in memory for their commit
	DefaultReceiveMemory    = 3 << 20 // 3 MiB
	MinReceiveMemory        = 1 << 20 // 1 MiB: room for a QUERY's frames
	MaxReceiveMemory        = 1 << 30 // 1 GiB
	DefaultOnFull           = OnFullReject
	DefaultVerifyOnStart    = VerifyUncleanStop
	DefaultScrubInterval    = 24 * time.Hour
	DefaultScrubRate        = 2 << 20 // bytes per second
)

// Bounds enforced by Validate.
const (
	// MaxWorkers bounds relay.workers: each worker holds one TLS connection
	// and one open segment, and the daemon runs on small devices.
	MaxWorkers = 256
	// MaxMaxRetries bounds relay.max_retries so a typo (1e9) cannot keep a
	// dead peer's records out of the deadletter list forever.
	MaxMaxRetries = 1000
	// MaxSegmentLimit is the largest storage.max_segment_bytes: a SEGMENT
	// frame's length field is 4 bytes (docs/wire.md).
	MaxSegmentLimit = 1<<32 - 1
	// MaxIDLen bounds node ids; they travel in certificates and HELLO frames.
	MaxIDLen = 64
	// MinLedgerRetention bounds relay.ledger_retention from below: a window
	// shorter than a peer's retry round would let echoes through.
	MinLedgerRetention = time.Hour
)

// Config is the whole agent configuration. Field comments name the YAML
// key and its default.
type Config struct {
	// NodeID (node_id, required) is this agent's identity; it must equal the
	// node id in its certificate. Letters, digits, '.', '-', '_', at most 64.
	NodeID string `yaml:"node_id"`
	// Listen (listen, default ":7400") is the host:port for inbound relay
	// connections (mutual TLS).
	Listen string `yaml:"listen"`
	// TLS (tls, required) names the PEM files for mutual TLS.
	TLS TLS `yaml:"tls"`
	// KnownPeers (known_peers, default none) are the only peers accepted
	// inbound and dialled outbound. Every known peer is a required peer for
	// the success condition.
	KnownPeers []Peer `yaml:"known_peers"`
	// AcceptFrom (accept_from, default none) are inbound-only peers: node
	// ids whose connections are accepted and whose segments are stored and
	// relayed to the known peers, but that are never dialled and are owed
	// nothing (a sensor that sends but has no address, or should not get
	// what others send). A node id is in known_peers or here, not both.
	AcceptFrom []string `yaml:"accept_from"`
	// Relay (relay) tunes outbound delivery.
	Relay Relay `yaml:"relay"`
	// Storage (storage) bounds local segment storage.
	Storage Storage `yaml:"storage"`
	// RPC (rpc) is the local operator interface.
	RPC RPC `yaml:"rpc"`
	// RelayAPI (relay_api, default off) is the relay's HTTP API that this
	// node reports its holdings to, pulls its takedown orders from and
	// posts its eviction receipts to (docs/takedown.md).
	RelayAPI RelayAPI `yaml:"relay_api"`
}

// Values of relay_api.auth.
const (
	// AuthMTLS presents the node's own certificate (tls.cert, tls.key) to
	// relay serve, which names the caller by the certificate's node id.
	AuthMTLS = "mtls"
	// AuthSigV4 signs each request with AWS Signature Version 4 (service
	// lambda, the default credential chain) for a Lambda function URL with
	// AWS_IAM auth, which names the caller by its IAM identity.
	AuthSigV4 = "sigv4"
)

// Defaults and bounds of relay_api.
const (
	DefaultRelayAPIAuth           = AuthMTLS
	DefaultRelayAPIReportInterval = 30 * time.Second
	DefaultRelayAPIReportDelay    = 2 * time.Second
	DefaultRelayAPIOrderInterval  = 30 * time.Second
	DefaultRelayAPIBatch          = 500
	DefaultRelayAPITimeout        = 30 * time.Second
	DefaultRelayAPIBackoffInitial = time.Second
	DefaultRelayAPIBackoffMax     = 5 * time.Minute
	// MaxRelayAPIBatch is the relay's bound on reports per POST
	// /v1/holdings.
	MaxRelayAPIBatch = 500
)

// RelayAPI is the connection to the relay's HTTP API (relay serve, or the
// api Lambda function's URL). Absent url: off, nothing is reported or
// pulled, and the other keys are only checked.
type RelayAPI struct {
	// URL (relay_api.url) is the API's https base URL, with a path prefix
	// if it has one: https://relay.example.net:8443, or a function URL.
	URL string `yaml:"url"`
	// CA (relay_api.ca, default the system roots) is the PEM bundle the
	// server's certificate must chain to.
	CA string `yaml:"ca"`
	// Auth (relay_api.auth, default mtls): mtls or sigv4.
	Auth string `yaml:"auth"`
	// Region (relay_api.region, required with sigv4) is the function
	// URL's AWS region, which SigV4 signs for.
	Region string `yaml:"region"`
	// ReportInterval (relay_api.report_interval, default 30s) is how often
	// the holdings are compared with what the relay was told and the
	// difference reported; a change is reported within it.
	ReportInterval time.Duration `yaml:"report_interval"`
	// ReportDelay (relay_api.report_delay, default 2s, >= 0) is how soon
	// a segment stored is reported: a commit starts a report pass, and
	// passes started so are at least ReportDelay apart, so a burst of
	// stores goes in one batch and a node storing all the time reports at
	// most once per ReportDelay. 0: stores wait for ReportInterval.
	ReportDelay time.Duration `yaml:"report_delay"`
	// OrderInterval (relay_api.order_interval, default 30s) is how often
	// the node asks for new takedown orders.
	OrderInterval time.Duration `yaml:"order_interval"`
	// Batch (relay_api.batch, default 500, 1..500) bounds the reports in
	// one POST /v1/holdings.
	Batch int `yaml:"batch"`
	// Timeout (relay_api.timeout, default 30s) bounds one request with its
	// answer.
	Timeout time.Duration `yaml:"timeout"`
	// Backoff (relay_api.backoff, default 1s..5m) paces retries after a
	// failed request: min(max, initial·2^(n-1)).
	Backoff Backoff `yaml:"backoff"`
}

// Enabled reports whether a relay API is configured.
func (r RelayAPI) Enabled() bool { return r.URL != "" }

// TLS names the certificate files. All three are required.
type TLS struct {
	Cert string `yaml:"cert"` // tls.cert: this node's certificate chain (PEM)
	Key  string `yaml:"key"`  // tls.key: its private key (PEM)
	CA   string `yaml:"ca"`   // tls.ca: CA bundle that peers' certificates must chain to (PEM)
}

// Peer is one statically configured peer.
type Peer struct {
	ID      string `yaml:"id"`      // known_peers[i].id: the node id in the peer's certificate
	Address string `yaml:"address"` // known_peers[i].address: host:port to dial
	// Bandwidth (known_peers[i].bandwidth) overrides relay.bandwidth.per_peer
	// for this peer; zero (absent) means the per-peer default applies.
	Bandwidth Rate `yaml:"bandwidth"`
}

// Relay tunes outbound delivery; see docs/edge-config.md.
type Relay struct {
	// SuccessCondition (success_condition, default all_peers): one_peer or
	// all_peers.
	SuccessCondition string `yaml:"success_condition"`
	// MaxRetries (max_retries, default 10, 1..1000) is the number of failed
	// attempts after which a (segment, peer) record is deadlettered.
	MaxRetries int `yaml:"max_retries"`
	// Backoff (backoff) is the delay before retrying a failed attempt.
	Backoff Backoff `yaml:"backoff"`
	// EvictOnRelay (evict_on_relay, default false) deletes a local segment
	// once the success condition is durably met.
	EvictOnRelay bool `yaml:"evict_on_relay"`
	// Workers (workers, default 4, 1..256) is the number of concurrent
	// outbound deliveries.
	Workers int `yaml:"workers"`
	// AckTimeout (ack_timeout, default 30s) bounds the wait for an ACK after
	// the segment is sent; a late ACK is a failed attempt.
	AckTimeout time.Duration `yaml:"ack_timeout"`
	// Window (window, default 256, 1..4096) is how many offers this node
	// accepts unanswered on one inbound version 2 connection (announced
	// in its HELLO); senders pipeline up to the peer's window.
	Window int `yaml:"window"`
	// MaxProtocolVersion (max_protocol_version, default 5, 1..5) is the
	// highest wire protocol version negotiated; 1 makes the node speak
	// only stop-and-wait version 1, as agents before version 2 did, 2
	// keeps it from asking peers for segments it lost (WANT, version 3),
	// and 3 from refusing taken-down segments with NACK evicted (version
	// 4: such a peer is told bad_request), and 4 from answering NACK busy
	// for a segment another copy of which is being taken in (version 5:
	// such a peer is told quota).
	MaxProtocolVersion int `yaml:"max_protocol_version"`
	// PushMaxBytes (push_max_bytes, default 65536, 0..65536): on version 2
	// connections a segment up to this size goes out in a PUSH, its bytes
	// right behind without waiting for the peer's ACCEPT, on its first
	// attempt (a retry is offered: the peer may hold it by then). It saves
	// a round trip per small segment; the price is sending the bytes of a
	// segment the peer already holds (from another node) instead of
	// learning that from its answer. 0 offers every segment.
	PushMaxBytes int64 `yaml:"push_max_bytes"`
	// DialTimeout (dial_timeout, default 10s) bounds connect + TLS handshake,
	// and an inbound connection's TLS handshake and HELLO.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// InboundMinRate (inbound_min_rate, default 16KiB, at least 1KiB) is
	// the slowest a peer may send one SEGMENT to this node: reading it may
	// take the idle timeout plus its size at this rate, after which the
	// receive is given up (nothing stored) and its quota reservation freed.
	// It must stay below what the slowest sender's link carries per
	// connection, or that sender's large segments never arrive.
	InboundMinRate Rate `yaml:"inbound_min_rate"`
	// LedgerRetention (ledger_retention, default 168h) is how long the
	// ledger records of a segment that is no longer stored are kept once
	// all of them are acked. They stop a copy of the segment that comes
	// back from being relayed again, so the window must outlast resends.
	LedgerRetention time.Duration `yaml:"ledger_retention"`
	// Bandwidth (bandwidth) bounds the bytes this node sends.
	Bandwidth Bandwidth `yaml:"bandwidth"`
}

// Bandwidth bounds what edged sends, in bytes per second on the wire (TLS
// included): per peer, and over all peers together. An absent key means
// no limit; a present one must be at least MinBandwidth.
type Bandwidth struct {
	Total   Rate `yaml:"total"`    // relay.bandwidth.total
	PerPeer Rate `yaml:"per_peer"` // relay.bandwidth.per_peer
}

// Rate is a byte rate per second, written as a size (64KiB, 10MB); zero
// means unlimited and can only come from an absent key: a present key
// with 0 is refused, so "no limit" is never a typo away from "nothing".
type Rate int64

// MinBandwidth is the smallest limit: below it a single TLS record waits
// for many seconds.
const MinBandwidth = 1 << 10

// Backoff is exponential: attempt n waits min(Max, Initial·2^(n-1)). There
// is no jitter, by design: the relay path is deterministic (no PRNG).
type Backoff struct {
	Initial time.Duration `yaml:"initial"` // relay.backoff.initial, default 1s
	Max     time.Duration `yaml:"max"`     // relay.backoff.max, default 5m
}

// Storage bounds local segment storage. Sizes accept plain byte counts or
// a unit suffix (KiB, MiB, GiB, TiB, KB, MB, GB, TB).
type Storage struct {
	// Dir (storage.dir, required) holds segments and the index/ledger file.
	Dir string `yaml:"dir"`
	// QuotaBytes (quota_bytes, default 1GiB) bounds the sum of stored and
	// in-flight segment sizes.
	QuotaBytes ByteSize `yaml:"quota_bytes"`
	// QuotaSegments (quota_segments, default 10000) bounds the number of
	// stored plus in-flight segments.
	QuotaSegments int64 `yaml:"quota_segments"`
	// MaxSegmentBytes (max_segment_bytes, default 64MiB) bounds one segment.
	MaxSegmentBytes ByteSize `yaml:"max_segment_bytes"`
	// VerifyOnStart (verify_on_start, default unclean_stop) says when a
	// start hashes every stored segment and quarantines the ones whose
	// content no longer matches their digest: always, unclean_stop (only
	// when the previous run did not stop cleanly: a crash, kill -9, power
	// loss, when damage is likeliest) or never. Hashing reads the whole
	// store; otherwise only sizes are checked at start, and a damaged copy
	// is found when it is next read: sent to a peer, or by the scrub.
	VerifyOnStart string `yaml:"verify_on_start"`
	// OnFull (on_full, default reject) is what a full store does with a
	// new segment: reject it, or evict_relayed_oldest: evict relayed
	// segments whose deliveries are all settled, oldest first, until it
	// fits. Full means the quota is reached or the disk refused a write.
	OnFull string `yaml:"on_full"`
	// FsyncEachFile (fsync_each_file, default false) fsyncs every received
	// segment file on its own. By default, on Linux 5.8 and later, the
	// segments committed together are made durable by one syncfs of the
	// store's file system; that also flushes other programs' unwritten
	// data on the same file system, which a store sharing it with a heavy
	// writer may not want. Elsewhere every file is fsynced on its own.
	FsyncEachFile bool `yaml:"fsync_each_file"`
	// PackMaxBytes (pack_max_bytes, default 64KiB, 0..1MiB) stores segments
	// up to this size as records appended to shared pack files instead of
	// a file each, where the file system can punch holes (evicted records'
	// blocks are freed at once); 0 keeps a file per segment. Creating a
	// file is most of the cost of storing a small segment.
	PackMaxBytes ByteSize `yaml:"pack_max_bytes"`
	// PeerReservePercent (peer_reserve_percent, default 25, 1..100) bounds
	// the share of quota_bytes (never below max_segment_bytes) and of
	// quota_segments that one peer's unfinished segments (offers accepted,
	// segments being received) may reserve at once, so that a peer whose
	// transfers stall cannot keep the others out. An offer beyond it is
	// refused with NACK quota.
	PeerReservePercent int `yaml:"peer_reserve_percent"`
	// ScrubInterval (scrub_interval, default 24h, 0 turns it off) is how
	// often a pass reads every stored segment back and checks it against
	// its digest, so that a copy nobody reads to send (one a peer's QUERY
	// or re-offer is answered for from the index) is found damaged too;
	// the first pass starts one interval after the start. A damaged copy
	// is quarantined and asked back from the peers.
	ScrubInterval time.Duration `yaml:"scrub_interval"`
	// ScrubRate (scrub_rate, default 2MiB, bytes per second, > 0) paces a
	// pass, so that it leaves the disk to the relay.
	ScrubRate ByteSize `yaml:"scrub_rate"`
	// ReceiveMemoryBytes (receive_memory_bytes, default 3MiB, 1MiB..1GiB)
	// bounds what inbound connections together hold in memory: small
	// segments received and not yet committed, and, in a second budget of
	// the same size, QUERY and HOLDS frames. When a budget is in use,
	// receivers wait for it and the senders' bytes wait in the network:
	// budgets for the process, so that the number of connections does not
	// multiply the agent's memory.
	ReceiveMemoryBytes ByteSize `yaml:"receive_memory_bytes"`
}

// RPC is the local operator interface.
type RPC struct {
	// Listen (rpc.listen, default "127.0.0.1:7401") is a loopback host:port
	// or "unix:/path/to.sock". Any address reachable from another machine is
	// refused: the RPC has no authentication.
	Listen string `yaml:"listen"`
	// IngestDirs (rpc.ingest_dirs, default none) are the directories from
	// which edged reads files itself for `edgectl segment put --by-path`.
	// Empty refuses by-path ingestion: any local RPC client could otherwise
	// make edged read, and relay, any file edged can read (its TLS key
	// included). Uploads of a file's bytes are not affected.
	IngestDirs []string `yaml:"ingest_dirs"`
}

// Default returns a configuration holding every default. NodeID, TLS and
// Storage.Dir have no default and must be set.
func Default() *Config {
	return &Config{
		Listen: DefaultListen,
		Relay: Relay{
			SuccessCondition:   DefaultSuccessCondition,
			MaxRetries:         DefaultMaxRetries,
			Backoff:            Backoff{Initial: DefaultBackoffInitial, Max: DefaultBackoffMax},
			Workers:            DefaultWorkers,
			AckTimeout:         DefaultAckTimeout,
			Window:             DefaultWindow,
			MaxProtocolVersion: DefaultProtocolVersion,
			PushMaxBytes:       DefaultPushMaxBytes,
			DialTimeout:        DefaultDialTimeout,
			InboundMinRate:     DefaultInboundMinRate,
			LedgerRetention:    DefaultLedgerRetention,
		},
		Storage: Storage{
			QuotaBytes:         DefaultQuotaBytes,
			QuotaSegments:      DefaultQuotaSegments,
			MaxSegmentBytes:    DefaultMaxSegmentBytes,
			VerifyOnStart:      DefaultVerifyOnStart,
			OnFull:             DefaultOnFull,
			PackMaxBytes:       DefaultPackMaxBytes,
			PeerReservePercent: DefaultPeerReservePct,
			ScrubInterval:      DefaultScrubInterval,
			ScrubRate:          DefaultScrubRate,
			ReceiveMemoryBytes: DefaultReceiveMemory,
		},
		RPC: RPC{Listen: DefaultRPCListen},
		RelayAPI: RelayAPI{
			Auth: DefaultRelayAPIAuth, ReportInterval: DefaultRelayAPIReportInterval, ReportDelay: DefaultRelayAPIReportDelay,
			OrderInterval: DefaultRelayAPIOrderInterval, Batch: DefaultRelayAPIBatch, Timeout: DefaultRelayAPITimeout,
			Backoff: Backoff{Initial: DefaultRelayAPIBackoffInitial, Max: DefaultRelayAPIBackoffMax},
		},
	}
}

// Load reads, decodes and validates the file at path, resolving relative
// paths against its directory. A returned error that is Problems lists
// every problem found.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	c, err := load(data, filepath.Dir(abs))
	if err != nil {
		return nil, fmt.Errorf("load config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes and validates a configuration held in memory. Relative
// paths are left as written (relative to the process's working directory).
func Parse(data []byte) (*Config, error) {
	c, err := load(data, "")
	if err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	return c, nil
}

// load decodes data and validates it, resolving relative paths against
// dir unless it is empty. The document's problems (unknown keys, values of
// the wrong kind) and the rule violations of what remains are reported
// together: an operator who fixed the first list must not meet a second
// one. A rule violation at a key the document check already reported, or
// inside it, is left out (a mistyped node_id is not also "required").
func load(data []byte, dir string) (*Config, error) {
	c, docProbs, err := decode(data)
	if err != nil {
		return nil, err
	}
	if dir != "" {
		c.resolve(dir)
	}
	probs := docProbs
	var ruleProbs Problems
	if err := c.Validate(); err != nil && !errors.As(err, &ruleProbs) {
		return nil, err
	}
	for _, p := range ruleProbs {
		if !docProbs.cover(p.Key) {
			probs = append(probs, p)
		}
	}
	if len(probs) > 0 {
		return nil, probs
	}
	return c, nil
}

// decode parses data, checks it against the schema (every unknown key and
// mistyped value is reported with its path, all at once), and decodes
// what the check left over the defaults. A YAML syntax error stops
// everything: nothing after it can be read reliably.
func decode(data []byte) (*Config, Problems, error) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil, errors.New("config is empty")
		}
		return nil, nil, syntaxError(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, nil, errors.New("config holds more than one YAML document")
	}
	var probs Problems
	checkSchema("", &doc, configType, &probs)
	c := Default()
	if err := doc.Decode(c); err != nil {
		// The schema check admits only what decodes; this is a bug guard.
		return nil, nil, fmt.Errorf("decode config: %w", err)
	}
	return c, probs, nil
}

// yamlLine matches yaml.v3's syntax error text.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parserProblems are the messages of yaml.v3's parser (as opposed to its
// scanner). For these, yaml.v3 (gopkg.in and go.yaml.in alike) prints a
// zero-based line number, so a problem on line 2 read "line 1"; scanner
// errors are one-based already. The line is that of the offending token or
// of the construct it is in (a flow mapping's "{", say).
var parserProblems = map[string]bool{
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"did not find expected '-' indicator":    true,
	"did not find expected <document start>": true,
	"did not find expected <stream-start>":   true,
	"did not find expected key":              true,
	"did not find expected node content":     true,
	"found duplicate %TAG directive":         true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found undefined tag handle":             true,
}

// syntaxError rewords a YAML syntax error with a one-based line number.
func syntaxError(err error) error {
	m := yamlLine.FindStringSubmatch(err.Error())
	if m == nil {
		return fmt.Errorf("YAML syntax error: %w", err)
	}
	line, _ := strconv.Atoi(m[1])
	if parserProblems[m[2]] {
		line++
	}
	return fmt.Errorf("YAML syntax error on line %d: %s", line, m[2])
}

// resolve makes relative file paths absolute against dir.
func (c *Config) resolve(dir string) {
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	c.TLS.Cert = abs(c.TLS.Cert)
	c.TLS.Key = abs(c.TLS.Key)
	c.TLS.CA = abs(c.TLS.CA)
	c.Storage.Dir = abs(c.Storage.Dir)
	c.RelayAPI.CA = abs(c.RelayAPI.CA)
	if p, ok := strings.CutPrefix(c.RPC.Listen, unixPrefix); ok {
		c.RPC.Listen = unixPrefix + abs(p)
	}
	for i, d := range c.RPC.IngestDirs {
		c.RPC.IngestDirs[i] = abs(d)
	}
}

// Peer returns the known peer with the given id.
func (c *Config) Peer(id string) (Peer, bool) {
	for _, p := range c.KnownPeers {
		if p.ID == id {
			return p, true
		}
	}
	return Peer{}, false
}

// Accepts reports whether inbound connections from node id are accepted:
// it is a known peer or listed in accept_from.
func (c *Config) Accepts(id string) bool {
	if _, ok := c.Peer(id); ok {
		return true
	}
	return slices.Contains(c.AcceptFrom, id)
}

// PeerIDs returns the known peers' ids in ascending order: the required
// peers for the success condition, in the order the relay works on them.
func (c *Config) PeerIDs() []string {
	ids := make([]string, 0, len(c.KnownPeers))
	for _, p := range c.KnownPeers {
		ids = append(ids, p.ID)
	}
	sort.Strings(ids)
	return ids
}

const unixPrefix = "unix:"

// Endpoint splits rpc.listen into the network and address that net.Listen
// takes: ("unix", path) or ("tcp", host:port).
func (r RPC) Endpoint() (network, address string) {
	if p, ok := strings.CutPrefix(r.Listen, unixPrefix); ok {
		return "unix", p
	}
	return "tcp", r.Listen
}
