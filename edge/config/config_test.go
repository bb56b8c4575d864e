package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// minimal is the smallest valid config.
const minimal = `
node_id: edge-a
tls: {cert: a.crt, key: a.key, ca: ca.crt}
storage: {dir: data}
`

// with returns minimal with a one-line top-level key replaced or added.
func with(line string) string {
	key, _, _ := strings.Cut(line, ":")
	var out []string
	for _, l := range strings.Split(minimal, "\n") {
		if !strings.HasPrefix(l, key+":") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n") + line + "\n"
}

const full = `
node_id: edge-a
listen: 0.0.0.0:7400
tls:
  cert: /etc/edged/a.crt
  key: /etc/edged/a.key
  ca: /etc/edged/ca.crt
known_peers:
  - {id: edge-c, address: 10.0.0.3:7400, bandwidth: 64KiB}
  - {id: edge-b, address: "[fd00::2]:7400"}
accept_from: [sensor-1]
relay:
  success_condition: one_peer
  max_retries: 5
  backoff: {initial: 250ms, max: 1m}
  evict_on_relay: true
  workers: 8
  ack_timeout: 5s
  window: 64
  max_protocol_version: 1
  push_max_bytes: 4096
  dial_timeout: 2s
  inbound_min_rate: 4KiB
  bandwidth: {total: 10MB, per_peer: 512KiB}
storage:
  dir: /var/lib/edged
  quota_bytes: 2GiB
  quota_segments: 500
  max_segment_bytes: 16777216
  verify_on_start: never
  on_full: evict_relayed_oldest
  fsync_each_file: true
  pack_max_bytes: 0
  peer_reserve_percent: 50
  scrub_interval: 6h
  scrub_rate: 512KiB
  receive_memory_bytes: 2MiB
rpc:
  listen: unix:/run/edged/rpc.sock
relay_api:
  url: https://abc.lambda-url.eu-west-1.on.aws/
  auth: sigv4
  region: eu-west-1
  report_interval: 1m
  report_delay: 500ms
  order_interval: 10s
  batch: 100
  timeout: 20s
  backoff: {initial: 2s, max: 10m}
`

func TestParseFull(t *testing.T) {
	c, err := Parse([]byte(full))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		NodeID: "edge-a",
		Listen: "0.0.0.0:7400",
		TLS:    TLS{Cert: "/etc/edged/a.crt", Key: "/etc/edged/a.key", CA: "/etc/edged/ca.crt"},
		KnownPeers: []Peer{
			{ID: "edge-c", Address: "10.0.0.3:7400", Bandwidth: 64 << 10},
			{ID: "edge-b", Address: "[fd00::2]:7400"},
		},
		AcceptFrom: []string{"sensor-1"},
		Relay: Relay{
			SuccessCondition: OnePeer, MaxRetries: 5,
			Backoff:      Backoff{Initial: 250 * time.Millisecond, Max: time.Minute},
			EvictOnRelay: true, Workers: 8, AckTimeout: 5 * time.Second, Window: 64, MaxProtocolVersion: 1, PushMaxBytes: 4096, DialTimeout: 2 * time.Second, InboundMinRate: 4 << 10, LedgerRetention: DefaultLedgerRetention,
			Bandwidth: Bandwidth{Total: 10_000_000, PerPeer: 512 << 10},
		},
		Storage: Storage{Dir: "/var/lib/edged", QuotaBytes: 2 << 30, QuotaSegments: 500, MaxSegmentBytes: 16 << 20, OnFull: OnFullEvictRelayedOldest, VerifyOnStart: VerifyNever, FsyncEachFile: true, PackMaxBytes: 0, PeerReservePercent: 50, ScrubInterval: 6 * time.Hour, ScrubRate: 512 << 10, ReceiveMemoryBytes: 2 << 20},
		RPC:     RPC{Listen: "unix:/run/edged/rpc.sock"},
		RelayAPI: RelayAPI{URL: "https://abc.lambda-url.eu-west-1.on.aws/", Auth: AuthSigV4, Region: "eu-west-1", ReportInterval: time.Minute,
			ReportDelay: 500 * time.Millisecond, OrderInterval: 10 * time.Second, Batch: 100, Timeout: 20 * time.Second, Backoff: Backoff{Initial: 2 * time.Second, Max: 10 * time.Minute}},
	}
	for id, want := range map[string]bool{"edge-b": true, "edge-c": true, "sensor-1": true, "edge-a": false, "edge-d": false} {
		if c.Accepts(id) != want {
			t.Errorf("Accepts(%s) = %v", id, !want)
		}
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got  %+v\nwant %+v", c, want)
	}
	if got := c.PeerIDs(); !reflect.DeepEqual(got, []string{"edge-b", "edge-c"}) {
		t.Fatalf("PeerIDs = %v, want sorted", got)
	}
	if p, ok := c.Peer("edge-b"); !ok || p.Address != "[fd00::2]:7400" {
		t.Fatalf("Peer(edge-b) = %v %v", p, ok)
	}
	if _, ok := c.Peer("edge-z"); ok {
		t.Fatal("Peer(edge-z) found")
	}
	if n, a := c.RPC.Endpoint(); n != "unix" || a != "/run/edged/rpc.sock" {
		t.Fatalf("Endpoint = %s %s", n, a)
	}
}

func TestParseMinimalTakesDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal + "relay:\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.NodeID = "edge-a"
	want.TLS = TLS{Cert: "a.crt", Key: "a.key", CA: "ca.crt"}
	want.Storage.Dir = "data"
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got  %+v\nwant %+v", c, want)
	}
	if n, a := c.RPC.Endpoint(); n != "tcp" || a != DefaultRPCListen {
		t.Fatalf("Endpoint = %s %s", n, a)
	}
}

// TestValidateRules has one case per rule; each names the key and a
// fragment of the message the operator sees.
func TestValidateRules(t *testing.T) {
	cases := []struct {
		name, yaml, key, msg string
	}{
		{"missing node id", "node_id: ''", "node_id", "required"},
		{"bad node id char", "node_id: 'edge a'", "node_id", "contains ' '"},
		{"node id too long", "node_id: " + strings.Repeat("x", 65), "node_id", "longer than 64"},
		// The wire (HELLO, certificates) refuses these, so edged could not
		// start; the config must say so naming the key.
		{"node id leading dash", "node_id: '-a'", "node_id", "must not start with"},
		{"node id leading dot", "node_id: '.a'", "node_id", "must not start with"},
		{"peer id leading dash", "known_peers: [{id: '-b', address: 'h:1'}]", "known_peers[0].id", "must not start with"},
		{"listen not host:port", "listen: 7400", "listen", "not host:port"},
		{"listen bad port", "listen: ':0'", "listen", "port must be"},
		{"listen empty", "listen: ''", "listen", "required"},
		{"tls cert missing", "tls: {key: a.key, ca: ca.crt}", "tls.cert", "required"},
		{"tls key missing", "tls: {cert: a.crt, ca: ca.crt}", "tls.key", "required"},
		{"tls ca missing", "tls: {cert: a.crt, key: a.key}", "tls.ca", "required"},
		{"peer duplicate id", "known_peers: [{id: b, address: 'h:1'}, {id: b, address: 'h:2'}]", "known_peers[1].id", `"b" duplicates known_peers[0].id`},
		{"peer own id", "known_peers: [{id: edge-a, address: 'h:1'}]", "known_peers[0].id", "own node_id"},
		{"peer empty id", "known_peers: [{address: 'h:1'}]", "known_peers[0].id", "required"},
		{"peer empty address", "known_peers: [{id: b}]", "known_peers[0].address", "required"},
		{"peer address no port", "known_peers: [{id: b, address: host}]", "known_peers[0].address", "not host:port"},
		{"peer address no host", "known_peers: [{id: b, address: ':7400'}]", "known_peers[0].address", "no host"},
		{"success condition", "relay: {success_condition: most}", "relay.success_condition", `"most" is not one of one_peer, all_peers`},
		{"max retries zero", "relay: {max_retries: 0}", "relay.max_retries", "out of range 1..1000"},
		{"max retries huge", "relay: {max_retries: 1001}", "relay.max_retries", "out of range"},
		{"backoff initial zero", "relay: {backoff: {initial: 0s}}", "relay.backoff.initial", "must be > 0"},
		{"backoff max negative", "relay: {backoff: {max: -1s}}", "relay.backoff.max", "must be > 0"},
		{"backoff max below initial", "relay: {backoff: {initial: 10s, max: 1s}}", "relay.backoff.max", "less than relay.backoff.initial"},
		{"backoff bad duration", "relay: {backoff: {initial: soon}}", "relay.backoff.initial", `"soon" is not a duration`},
		{"duration without unit", "relay: {ack_timeout: 30}", "relay.ack_timeout", `"30" is not a duration`},
		{"workers zero", "relay: {workers: 0}", "relay.workers", "out of range 1..256"},
		{"workers too many", "relay: {workers: 257}", "relay.workers", "out of range"},
		{"workers not int", "relay: {workers: many}", "relay.workers", `"many" is not an integer`},
		{"ack timeout zero", "relay: {ack_timeout: 0s}", "relay.ack_timeout", "must be > 0"},
		{"window zero", "relay: {window: 0}", "relay.window", "out of range 1..4096"},
		{"window too large", "relay: {window: 4097}", "relay.window", "out of range"},
		{"push too large", "relay: {push_max_bytes: 65537}", "relay.push_max_bytes", "out of range 0..65536"},
		{"push negative", "relay: {push_max_bytes: -1}", "relay.push_max_bytes", "out of range"},
		{"pack too large", "storage: {pack_max_bytes: 2MiB}", "storage.pack_max_bytes", "out of range 0..1048576"},
		{"pack negative", "storage: {pack_max_bytes: -1}", "storage.pack_max_bytes", "out of range"},
		{"inbound rate too low", "relay: {inbound_min_rate: 512}", "relay.inbound_min_rate", "below the minimum of 1KiB"},
		{"inbound rate zero", "relay: {inbound_min_rate: 0}", "relay.inbound_min_rate", "must be > 0"},
		{"peer share zero", "storage: {peer_reserve_percent: 0}", "storage.peer_reserve_percent", "out of range 1..100"},
		{"peer share above all", "storage: {peer_reserve_percent: 101}", "storage.peer_reserve_percent", "out of range 1..100"},
		{"protocol version 6", "relay: {max_protocol_version: 6}", "relay.max_protocol_version", "out of range 1..5"},
		{"receive memory too small", "storage: {receive_memory_bytes: 64KiB}", "storage.receive_memory_bytes", "out of range 1MiB..1GiB"},
		{"receive memory too large", "storage: {receive_memory_bytes: 2GiB}", "storage.receive_memory_bytes", "out of range 1MiB..1GiB"},
		{"protocol version 0", "relay: {max_protocol_version: 0}", "relay.max_protocol_version", "out of range"},
		{"scrub interval negative", "storage: {scrub_interval: -1h}", "storage.scrub_interval", "must be >= 0"},
		{"scrub rate zero", "storage: {scrub_rate: 0}", "storage.scrub_rate", "must be > 0"},
		{"dial timeout negative", "relay: {dial_timeout: -5s}", "relay.dial_timeout", "must be > 0"},
		{"ledger retention too short", "relay: {ledger_retention: 5m}", "relay.ledger_retention", "below 1h0m0s"},
		{"evict not bool", "relay: {evict_on_relay: maybe}", "relay.evict_on_relay", "not true or false"},
		{"storage dir missing", "storage: {dir: ''}", "storage.dir", "required"},
		{"quota bytes zero", "storage: {dir: d, quota_bytes: 0}", "storage.quota_bytes", "must be > 0"},
		{"quota bytes negative", "storage: {dir: d, quota_bytes: -1}", "storage.quota_bytes", "must be > 0"},
		{"quota bytes bad unit", "storage: {dir: d, quota_bytes: 5XB}", "storage.quota_bytes", "is not a size"},
		{"quota segments zero", "storage: {dir: d, quota_segments: 0}", "storage.quota_segments", "must be > 0"},
		{"max segment zero", "storage: {dir: d, max_segment_bytes: 0}", "storage.max_segment_bytes", "must be > 0"},
		{"max segment over wire limit", "storage: {dir: d, quota_bytes: 1TiB, max_segment_bytes: 4GiB}", "storage.max_segment_bytes", "wire limit"},
		{"bandwidth zero", "relay: {bandwidth: {total: 0}}", "relay.bandwidth.total", "must be > 0 bytes per second; leave the key out for no limit"},
		{"bandwidth negative", "relay: {bandwidth: {per_peer: -5KiB}}", "relay.bandwidth.per_peer", "must be > 0"},
		{"bandwidth tiny", "relay: {bandwidth: {per_peer: 100}}", "relay.bandwidth.per_peer", "below the minimum of 1KiB"},
		{"bandwidth not a size", "relay: {bandwidth: {total: fast}}", "relay.bandwidth.total", "is not a size"},
		{"bandwidth a list", "relay: {bandwidth: {total: [1MB]}}", "relay.bandwidth.total", "must be a rate"},
		{"peer bandwidth zero", "known_peers: [{id: b, address: 'h:1', bandwidth: 0}]", "known_peers[0].bandwidth", "must be > 0"},
		{"peer bandwidth tiny", "known_peers: [{id: b, address: 'h:1', bandwidth: 1000}]", "known_peers[0].bandwidth", "below the minimum of 1KiB"},
		{"bandwidth unknown key", "relay: {bandwidth: {per_node: 1MB}}", "relay.bandwidth.per_node", "unknown key"},
		{"on_full unknown", "storage: {dir: d, on_full: drop_oldest}", "storage.on_full", `"drop_oldest" is not one of reject, evict_relayed_oldest`},
		{"on_full empty", "storage: {dir: d, on_full: ''}", "storage.on_full", `"" is not one of reject, evict_relayed_oldest`},
		{"on_full not a value", "storage: {dir: d, on_full: [reject]}", "storage.on_full", "must be a single value"},
		{"verify_on_start a bool", "storage: {dir: d, verify_on_start: true}", "storage.verify_on_start", `"true" is not one of always, unclean_stop, never`},
		{"storage unknown key", "storage: {dir: d, on_ful: reject}", "storage.on_ful", "unknown key"},
		{"max segment over quota", "storage: {dir: d, quota_bytes: 1MiB, max_segment_bytes: 2MiB}", "storage.max_segment_bytes", "exceeds storage.quota_bytes"},
		{"rpc public ip", "rpc: {listen: '0.0.0.0:7401'}", "rpc.listen", "not a loopback address"},
		{"rpc lan ip", "rpc: {listen: '192.168.1.5:7401'}", "rpc.listen", "not a loopback address"},
		{"rpc hostname", "rpc: {listen: 'example.com:7401'}", "rpc.listen", "not a loopback address"},
		{"rpc all interfaces", "rpc: {listen: ':7401'}", "rpc.listen", "has no host"},
		{"rpc unix empty", "rpc: {listen: 'unix:'}", "rpc.listen", "needs a socket path"},
		{"rpc unix abstract", "rpc: {listen: 'unix:@edged'}", "rpc.listen", "abstract"},
		{"unknown top key", "colour: blue", "colour", "unknown key"},
		{"unknown nested key", "relay: {evict_on_relays: true}", "relay.evict_on_relays", "unknown key"},
		{"unknown peer key", "known_peers: [{id: b, address: 'h:1', port: 3}]", "known_peers[0].port", "unknown key"},
		{"duplicate key", "relay: {workers: 2, workers: 3}", "relay.workers", "given twice"},
		{"duplicate top key", "node_id: x\nnode_id: y", "node_id", "given twice"},
		{"mapping for scalar", "node_id: {a: b}", "node_id", "single value"},
		{"scalar for mapping", "relay: fast", "relay", "mapping"},
		{"scalar for list", "known_peers: b", "known_peers", "must be a list"},
		{"accept_from bad id", "accept_from: ['-s']", "accept_from[0]", "must not start with"},
		{"accept_from own id", "accept_from: [edge-a]", "accept_from[0]", "own node_id"},
		{"accept_from duplicate", "accept_from: [s, s]", "accept_from[1]", `"s" duplicates accept_from[0]`},
		{"accept_from known peer", "known_peers: [{id: b, address: 'h:1'}]\naccept_from: [b]", "accept_from[0]", "is known_peers[0] already"},
		{"accept_from mapping", "accept_from: [{id: s}]", "accept_from[0]", "single value"},
		{"relay_api unknown key", "relay_api: {url: 'https://r:1', interval: 1s}", "relay_api.interval", "unknown key"},
		{"relay_api http", "relay_api: {url: 'http://r:8443'}", "relay_api.url", "must be https://"},
		{"relay_api no host", "relay_api: {url: 'https:///v1'}", "relay_api.url", "no host"},
		{"relay_api credentials", "relay_api: {url: 'https://u:p@r'}", "relay_api.url", "carries credentials"},
		{"relay_api query", "relay_api: {url: 'https://r/?a=1'}", "relay_api.url", "no query"},
		{"relay_api ca without url", "relay_api: {ca: ca.crt}", "relay_api.ca", "without relay_api.url"},
		{"relay_api auth", "relay_api: {url: 'https://r', auth: token}", "relay_api.auth", `"token" is not one of mtls, sigv4`},
		{"relay_api sigv4 no region", "relay_api: {url: 'https://x.lambda-url.eu-west-1.on.aws', auth: sigv4}", "relay_api.region", "required with relay_api.auth: sigv4"},
		{"relay_api region with mtls", "relay_api: {url: 'https://r', region: eu-west-1}", "relay_api.region", "only with relay_api.auth: sigv4"},
		{"relay_api batch zero", "relay_api: {url: 'https://r', batch: 0}", "relay_api.batch", "out of range 1..500"},
		{"relay_api batch over", "relay_api: {url: 'https://r', batch: 501}", "relay_api.batch", "out of range 1..500"},
		{"relay_api interval zero", "relay_api: {url: 'https://r', report_interval: 0s}", "relay_api.report_interval", "must be > 0"},
		{"relay_api report delay negative", "relay_api: {url: 'https://r', report_delay: -1s}", "relay_api.report_delay", "must be >= 0"},
		{"relay_api backoff", "relay_api: {url: 'https://r', backoff: {initial: 10s, max: 1s}}", "relay_api.backoff.max", "less than relay_api.backoff.initial"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(with(tc.yaml)))
			var ps Problems
			if !errors.As(err, &ps) {
				t.Fatalf("err = %v, want Problems", err)
			}
			for _, p := range ps {
				if p.Key == tc.key && strings.Contains(p.Message, tc.msg) {
					return
				}
			}
			t.Fatalf("no problem %s: ...%s...; got:\n%v", tc.key, tc.msg, err)
		})
	}
}

func TestValidAddressesAccepted(t *testing.T) {
	for _, rpc := range []string{"127.0.0.1:7401", "127.9.9.9:1", "'[::1]:7401'", "localhost:7401", "unix:/run/edged.sock", "unix:rel.sock"} {
		t.Run(rpc, func(t *testing.T) {
			if _, err := Parse([]byte(minimal + "rpc: {listen: " + rpc + "}\n")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAllProblemsAtOnce: an operator fixes a config in one pass, so every
// schema problem is reported together, and so is every rule violation.
func TestAllProblemsAtOnce(t *testing.T) {
	_, err := Parse([]byte(minimal + "colour: blue\nrelay: {workerz: 1, ack_timeout: x}\n"))
	var ps Problems
	if !errors.As(err, &ps) || len(ps) != 3 {
		t.Fatalf("want 3 schema problems, got %v", err)
	}
	_, err = Parse([]byte("node_id: ''\nrelay: {workers: 0, max_retries: 0}\n"))
	if !errors.As(err, &ps) {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, p := range ps {
		keys[p.Key] = true
	}
	for _, k := range []string{"node_id", "tls.cert", "tls.key", "tls.ca", "relay.workers", "relay.max_retries", "storage.dir"} {
		if !keys[k] {
			t.Errorf("missing problem for %s in %v", k, err)
		}
	}
}

// TestDocumentAndRuleProblemsTogether: document problems (unknown key,
// wrong kinds) used to hide the rule violations: a file showed 2
// problems, then 8 once those were fixed. Now one pass lists all, and a key
// the document check reported is not reported again by a rule.
func TestDocumentAndRuleProblemsTogether(t *testing.T) {
	doc := "node_id: [edge-a]\ncolour: blue\nrelay: {workers: [1], max_retries: 0, backoff: {initial: 0s}}\n" +
		"known_peers: [{id: b, address: 'h:1'}, oops, {id: c}]\nstorage: {dir: d, quota_bytes: 0}\n"
	_, err := Parse([]byte(doc))
	var ps Problems
	if !errors.As(err, &ps) {
		t.Fatalf("err = %v, want Problems", err)
	}
	got := map[string]string{}
	for _, p := range ps {
		if _, dup := got[p.Key]; dup {
			t.Errorf("%s reported twice: %v", p.Key, err)
		}
		got[p.Key] = p.Message
	}
	want := map[string]string{
		"node_id":                "must be a single value, not a list (line 1)",
		"colour":                 "unknown key (line 2)",
		"relay.workers":          "must be an integer, not a list (line 3)",
		"relay.max_retries":      "out of range",
		"relay.backoff.initial":  "must be > 0",
		"known_peers[1]":         `must be a mapping of keys, not "oops" (line 4)`,
		"known_peers[2].address": "required",
		"tls.cert":               "required",
		"tls.key":                "required",
		"tls.ca":                 "required",
		"storage.quota_bytes":    "must be > 0",
	}
	for k, msg := range want {
		if !strings.Contains(got[k], msg) {
			t.Errorf("%s: got %q, want ...%s...", k, got[k], msg)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d problems, want %d:\n%v", len(got), len(want), err)
	}
}

// TestSyntaxErrorLines: yaml.v3 prints parser errors with a zero-based
// line; the message must name the line the problem is on (or the line
// its enclosing flow collection starts on).
func TestSyntaxErrorLines(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		line int
	}{
		{"node_id: a\nrelay: {workers: 1\n", 2},                    // parser: unclosed flow mapping
		{"node_id: a\nstorage: {dir: d}\nknown_peers: [a, b\n", 3}, // parser: unclosed flow sequence
		{"node_id: a\nlisten: x\n- b\n", 3},                        // parser: a list item in a mapping
		{"node_id: a\nlisten: @x\n", 2},                            // scanner
		{"node_id: a\n\tlisten: x\n", 2},                           // scanner: tab
		{"node_id: a\nlisten: x: y\n", 2},                          // scanner
	} {
		_, err := Parse([]byte(tc.doc))
		if want := fmt.Sprintf("YAML syntax error on line %d:", tc.line); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want %q", tc.doc, err, want)
		}
	}
}

func TestParseDocumentErrors(t *testing.T) {
	for name, doc := range map[string]string{
		"empty":     "",
		"two docs":  minimal + "---\nnode_id: x\n",
		"not yaml":  "node_id: [",
		"top list":  "- a\n- b\n",
		"top value": "hello",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse([]byte(doc)); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestLoadResolvesRelativePaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "edged.yaml")
	doc := minimal + "rpc: {listen: 'unix:run/rpc.sock'}\nrelay_api: {url: 'https://relay:8443', ca: certs/relay-ca.crt}\n"
	doc = strings.Replace(doc, "ca: ca.crt", "ca: /abs/ca.crt", 1)
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.TLS.Cert != filepath.Join(dir, "a.crt") || c.TLS.Key != filepath.Join(dir, "a.key") || c.TLS.CA != "/abs/ca.crt" {
		t.Fatalf("tls not resolved: %+v", c.TLS)
	}
	if c.Storage.Dir != filepath.Join(dir, "data") {
		t.Fatalf("storage.dir = %s", c.Storage.Dir)
	}
	if c.RPC.Listen != "unix:"+filepath.Join(dir, "run/rpc.sock") {
		t.Fatalf("rpc.listen = %s", c.RPC.Listen)
	}
	if c.RelayAPI.CA != filepath.Join(dir, "certs/relay-ca.crt") || !c.RelayAPI.Enabled() {
		t.Fatalf("relay_api = %+v", c.RelayAPI)
	}
}

func TestLoadErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("err = %v", err)
	}
	path := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(path, []byte(minimal+"relay: {success_condition: most}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `relay.success_condition: "most" is not one of one_peer, all_peers`) {
		t.Fatalf("err = %v", err)
	}
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]ByteSize{
		"0": 0, "1048576": 1 << 20, "64MiB": 64 << 20, "1 GiB": 1 << 30, "2TiB": 2 << 40,
		"10KB": 10000, "3GB": 3e9, "512B": 512, "-1": -1, "1KiB": 1024,
	} {
		got, err := ParseByteSize(in)
		if err != nil || got != want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "1.5GiB", "10 kb", "9999999999TiB", "x1"} {
		if _, err := ParseByteSize(in); err == nil {
			t.Errorf("ParseByteSize(%q) accepted", in)
		}
	}
	for b, want := range map[ByteSize]string{64 << 20: "64MiB", 1 << 30: "1GiB", 1000: "1000B", 0: "0B", 3 << 10: "3KiB"} {
		if got := b.String(); got != want {
			t.Errorf("%d.String() = %s, want %s", int64(b), got, want)
		}
	}
}

// TestDefaultsDocumented keeps docs/edge-config.md in step with Default():
// each key's table row must show the default the code uses.
func TestDefaultsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "edge-config.md"))
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	want := map[string]string{
		"listen":                       d.Listen,
		"relay.success_condition":      d.Relay.SuccessCondition,
		"relay.max_retries":            "10",
		"relay.backoff.initial":        d.Relay.Backoff.Initial.String(),
		"relay.backoff.max":            d.Relay.Backoff.Max.String(),
		"relay.evict_on_relay":         "false",
		"relay.workers":                "4",
		"relay.ack_timeout":            d.Relay.AckTimeout.String(),
		"relay.window":                 "256",
		"relay.max_protocol_version":   "4",
		"relay.push_max_bytes":         "65536",
		"relay.dial_timeout":           d.Relay.DialTimeout.String(),
		"relay.inbound_min_rate":       ByteSize(d.Relay.InboundMinRate).String(),
		"relay.ledger_retention":       d.Relay.LedgerRetention.String(),
		"relay.bandwidth.total":        d.Relay.Bandwidth.Total.String(),
		"relay.bandwidth.per_peer":     d.Relay.Bandwidth.PerPeer.String(),
		"storage.quota_bytes":          d.Storage.QuotaBytes.String(),
		"storage.quota_segments":       "10000",
		"storage.max_segment_bytes":    d.Storage.MaxSegmentBytes.String(),
		"storage.verify_on_start":      d.Storage.VerifyOnStart,
		"storage.on_full":              d.Storage.OnFull,
		"storage.fsync_each_file":      "false",
		"storage.pack_max_bytes":       d.Storage.PackMaxBytes.String(),
		"storage.peer_reserve_percent": "25",
		"storage.scrub_interval":       "24h",
		"storage.scrub_rate":           d.Storage.ScrubRate.String(),
		"storage.receive_memory_bytes": d.Storage.ReceiveMemoryBytes.String(),
		"rpc.listen":                   d.RPC.Listen,
		"relay_api.auth":               d.RelayAPI.Auth,
		"relay_api.report_interval":    d.RelayAPI.ReportInterval.String(),
		"relay_api.report_delay":       d.RelayAPI.ReportDelay.String(),
		"relay_api.order_interval":     d.RelayAPI.OrderInterval.String(),
		"relay_api.batch":              "500",
		"relay_api.timeout":            d.RelayAPI.Timeout.String(),
		"relay_api.backoff.initial":    d.RelayAPI.Backoff.Initial.String(),
		"relay_api.backoff.max":        d.RelayAPI.Backoff.Max.String(),
	}
	rows := map[string]string{}
	for _, line := range strings.Split(string(doc), "\n") {
		if k, ok := strings.CutPrefix(line, "| `"); ok {
			if i := strings.Index(k, "`"); i > 0 {
				rows[k[:i]] = line
			}
		}
	}
	for key, def := range want {
		row, ok := rows[key]
		if !ok {
			t.Errorf("docs/edge-config.md has no row for %s", key)
			continue
		}
		if !strings.Contains(row, "`"+def+"`") {
			t.Errorf("docs row for %s does not show default `%s`: %s", key, def, row)
		}
	}
	for _, key := range []string{"node_id", "tls.cert", "tls.key", "tls.ca", "known_peers[].id", "known_peers[].address", "accept_from", "storage.dir", "rpc.ingest_dirs", "relay_api.url", "relay_api.ca", "relay_api.region"} {
		if _, ok := rows[key]; !ok {
			t.Errorf("docs/edge-config.md has no row for %s", key)
		}
	}
}
