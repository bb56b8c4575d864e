// Package rpc is edged's local operator interface: JSON over HTTP on a
// loopback address or a unix socket, never a public address, because it
// has no authentication (whoever can reach it can retry, purge and ingest).
// Listen enforces that, in addition to edge/config's validation. Because a
// web browser on the device can reach loopback too, the server refuses
// (403) cross-origin POSTs and, over TCP, any Host that is not a loopback
// name (DNS rebinding).
//
// Endpoints (all JSON unless noted; errors are {"error": "..."} with a
// status from the failure's sentinel, see statusOf):
//
//	GET  /v1/status                node, peers, ledger counts, storage use
//	GET  /v1/index                 stored segments
//	GET  /v1/storage               storage directory, use, start-up repairs
//	GET  /v1/quota                 quota use and headroom
//	GET  /v1/retry[?state=S]       ledger records (default: all but acked)
//	GET  /v1/assurance?segment=ID  per-peer delivery and the success condition
//	GET  /v1/deadletter            deadlettered records
//	POST /v1/deadletter/retry      {"segment":"S","peer":"P"} (either or both), or {"all":true};
//	                               {} is refused (400); a peer or segment without ledger records is 404
//	POST /v1/deadletter/purge      same body
//	POST /v1/relay/resend          {"segment":"S","peer":"P"}: send S to P again (P lost its copy)
//	POST /v1/segments?id=ID&sha256=HEX   body = segment bytes (Content-Length required)
//	POST /v1/segments              {"path":"/file","id":"ID"}: the daemon reads the file,
//	                               which must resolve to a regular file inside rpc.ingest_dirs (403 otherwise)
//	GET  /metrics                  Prometheus text format
//	GET  /healthz                  "ok" (200) or the reason (503)
//
// Request bodies are paced (ServerOptions): a body with no progress for
// BodyIdleTimeout, or slower overall than BodyMinRate, fails with 408, so
// a stalled upload cannot hold its quota reservation.
//
// The server side consumes a Backend (implemented by edge/daemon); Client
// is the typed client edgectl uses.
package rpc

import (
	"fmt"
	"time"
)

// Status is GET /v1/status.
type Status struct {
	NodeID           string    `json:"node_id"`
	Version          string    `json:"version"`
	StartedAt        time.Time `json:"started_at"`
	Listen           string    `json:"listen"`
	SuccessCondition string    `json:"success_condition"`
	EvictOnRelay     bool      `json:"evict_on_relay"`
	Peers            []Peer    `json:"peers"`
	// AcceptFrom are the inbound-only peers (accept_from): accepted, never
	// dialled, owed nothing.
	AcceptFrom []string       `json:"accept_from,omitempty"`
	Ledger     map[string]int `json:"ledger"` // records per state
	Segments   int            `json:"segments"`
	Relayed    int            `json:"relayed"`
	Usage      Usage          `json:"usage"`
	// RelayAPI is the relay API client's state (relay_api); absent when
	// it is off.
	RelayAPI *RelayAPI `json:"relay_api,omitempty"`
}

// RelayAPI is what edged's client of the relay's takedown API has done
// (docs/takedown.md): its three jobs.
type RelayAPI struct {
	URL      string      `json:"url"`
	Auth     string      `json:"auth"`
	Holdings RelayAPIJob `json:"holdings"`
	Orders   RelayAPIJob `json:"orders"`
	Receipts RelayAPIJob `json:"receipts"`
	// Cursor is the last order handled for good (the orders job).
	Cursor string `json:"cursor,omitempty"`
}

// RelayAPIJob is one job of the relay API client. Counts are since the
// start, by result: for holdings "sent" (reports the relay accepted), for
// orders evicted, receipt, not_held and invalid, for receipts accepted,
// replayed and refused. Pending is what the last pass found still owed:
// holdings reports, or receipts without the relay's verdict.
type RelayAPIJob struct {
	Counts      map[string]int64 `json:"counts"`
	Pending     int              `json:"pending"`
	LastSuccess *time.Time       `json:"last_success,omitempty"`
	LastError   string           `json:"last_error,omitempty"`
	LastErrorAt *time.Time       `json:"last_error_at,omitempty"`
	// LastRefusal is the last request the relay refused for good (a 4xx)
	// without failing the pass: a receipt it refused, with its reason.
	LastRefusal   string     `json:"last_refusal,omitempty"`
	LastRefusalAt *time.Time `json:"last_refusal_at,omitempty"`
	// Failures counts the passes failed in a row; NextAttempt is when the
	// job runs again after one (its back-off).
	Failures    int        `json:"failures,omitempty"`
	NextAttempt *time.Time `json:"next_attempt,omitempty"`
	// Passes counts the passes ended since the start, with or without an
	// error, and whether or not they had anything to send (LastSuccess
	// moves only for one the relay answered).
	Passes int `json:"passes"`
}

// Peer is a configured peer and its dial circuit (docs/edge.md): closed
// (dials go ahead), open (dials failed; records owed to it are deferred to
// reopen_at without an attempt), half_open (the next record probes).
type Peer struct {
	ID            string     `json:"id"`
	Address       string     `json:"address"`
	Circuit       string     `json:"circuit"`
	DialFailures  int        `json:"dial_failures,omitempty"` // consecutive failed dial rounds
	ReopenAt      *time.Time `json:"reopen_at,omitempty"`
	Probing       bool       `json:"probing,omitempty"`
	LastDialError string     `json:"last_dial_error,omitempty"`
	// NotDialed: the agent has not dialled the peer since it started
	// (nothing owed to it came due), so a closed circuit is no news of it.
	NotDialed bool `json:"not_dialed,omitempty"`
	// Room is the peer's room circuit: open while it refuses segments for
	// want of room (NACK quota), which postpones them without spending
	// their retry budget until room_reopen_at; closed (or absent, from an
	// older edged) otherwise.
	Room         string     `json:"room,omitempty"`
	RoomRefusals int        `json:"room_refusals,omitempty"` // consecutive refusing rounds
	RoomReopenAt *time.Time `json:"room_reopen_at,omitempty"`
}

// Segment is one stored segment (an index entry).
type Segment struct {
	ID        string     `json:"id"`
	Size      int64      `json:"size"`
	SHA256    string     `json:"sha256"`
	Received  time.Time  `json:"received"`
	Source    string     `json:"source,omitempty"` // peer it came from; empty for local ingest
	Relayed   bool       `json:"relayed"`
	RelayedAt *time.Time `json:"relayed_at,omitempty"`
	// Rebuilt is set on an entry rebuilt from its file after the database
	// was lost: "tag" (the file matched its digest tag) or "content" (no
	// tag; the digest is the content's own).
	Rebuilt string `json:"rebuilt,omitempty"`
}

// Index is GET /v1/index.
type Index struct {
	Segments []Segment `json:"segments"`
}

// Usage is GET /v1/quota: stored plus reserved against the quota.
type Usage struct {
	Bytes            int64 `json:"bytes"`
	Segments         int64 `json:"segments"`
	ReservedBytes    int64 `json:"reserved_bytes"`
	ReservedSegments int64 `json:"reserved_segments"`
	QuotaBytes       int64 `json:"quota_bytes"`
	QuotaSegments    int64 `json:"quota_segments"`
	MaxSegmentBytes  int64 `json:"max_segment_bytes"`
	FreeBytes        int64 `json:"free_bytes"`
	FreeSegments     int64 `json:"free_segments"`
}

// Storage is GET /v1/storage.
type Storage struct {
	Dir   string `json:"dir"`
	Usage Usage  `json:"usage"`
	// Repaired lists what the start-up scan cleaned up.
	RemovedTemp    []string `json:"removed_temp,omitempty"`
	RemovedOrphans []string `json:"removed_orphans,omitempty"`
	DroppedEntries []string `json:"dropped_entries,omitempty"`
	Unknown        []string `json:"unknown_files,omitempty"`
	// DBMovedAside is where a damaged database was moved at start (a new
	// one took its place), and DBDamage why.
	DBMovedAside string `json:"db_moved_aside,omitempty"`
	DBDamage     string `json:"db_damage,omitempty"`
	// Rebuilt are the index entries rebuilt from segment files; Unverified
	// those among them whose file had no digest tag.
	Rebuilt    []string `json:"rebuilt,omitempty"`
	Unverified []string `json:"unverified,omitempty"`
	// Quarantined are damaged copies moved or copied to QuarantineDir,
	// at start or since (found damaged on read); Wanted the segments lost
	// so and not stored again yet.
	Quarantined   []Quarantined `json:"quarantined,omitempty"`
	Wanted        []Wanted      `json:"wanted,omitempty"`
	QuarantineDir string        `json:"quarantine_dir"`
	// Verified counts the stored segments whose content was hashed at
	// start, segment files and pack records alike (see
	// storage.verify_on_start; all of them in a rebuild).
	Verified int `json:"verified"`
	// PreviousStop is how the previous run ended: "clean", "unclean"
	// (crash, kill, power loss) or "none" (a new store: there was no
	// database). PreviousStopClean is PreviousStop == "clean", kept for
	// clients older than PreviousStop.
	PreviousStop      string `json:"previous_stop"`
	PreviousStopClean bool   `json:"previous_stop_clean"`
	Packs             Packs  `json:"packs"`
}

// Packs describes the pack files small segments are stored in
// (storage.pack_max_bytes): Packing is false when that is 0 or the file
// system cannot punch holes. DiskBytes is what the pack files take on
// disk, RecordBytes what their live records need.
type Packs struct {
	Packing     bool  `json:"packing"`
	MaxBytes    int64 `json:"max_bytes"`
	Files       int   `json:"files"`
	Segments    int   `json:"segments"`
	RecordBytes int64 `json:"record_bytes"`
	DiskBytes   int64 `json:"disk_bytes"`
}

// Quarantined is one damaged copy set aside.
type Quarantined struct {
	Segment string `json:"segment"`
	File    string `json:"file"` // name in QuarantineDir
	Reason  string `json:"reason"`
	// Found is "start" (the start-up check) or "read" (read to be sent).
	Found string `json:"found,omitempty"`
}

// Wanted is a segment this node acknowledged once and lost (quarantined,
// or its file gone): it asks its peers for a good copy (docs/edge.md).
type Wanted struct {
	Segment string    `json:"segment"`
	Size    int64     `json:"size"`
	SHA256  string    `json:"sha256"`
	Source  string    `json:"source,omitempty"` // the peer it came from; empty for a local ingest
	Since   time.Time `json:"since"`
}

// Record is one ledger record.
type Record struct {
	Segment          string     `json:"segment"`
	Peer             string     `json:"peer"`
	State            string     `json:"state"`
	Attempts         int        `json:"attempts"`
	BudgetUsed       int        `json:"budget_used"`
	NextAttemptAfter *time.Time `json:"next_attempt_after,omitempty"`
	LastError        string     `json:"last_error,omitempty"`
	UpdatedAt        time.Time  `json:"updated_at"`
}

// Records is GET /v1/retry and GET /v1/deadletter.
type Records struct {
	Records []Record `json:"records"`
}

// Assurance is GET /v1/assurance.
type Assurance struct {
	Segment   string `json:"segment"`
	Stored    bool   `json:"stored"`
	Relayed   bool   `json:"relayed"`
	Condition string `json:"condition"`
	// RequiredPeers are the known peers the segment is owed to (all but
	// its source). Once it is evicted the source is no longer known, and
	// they are the known peers that have a ledger record for it.
	RequiredPeers []string `json:"required_peers"`
	AckedPeers    []string `json:"acked_peers"`
	Met           bool     `json:"met"`
	Records       []Record `json:"records"`
}

// Selector picks deadlettered records for a retry or a purge: those of
// Segment, of Peer, or of both (one record); or, with All and neither
// id, every deadlettered record. A selector naming nothing is refused
// (400) rather than taken as "all": a client that forgot its filter must
// not retry or purge everything.
type Selector struct {
	Segment string `json:"segment,omitempty"`
	Peer    string `json:"peer,omitempty"`
	All     bool   `json:"all,omitempty"`
}

// Check reports a selector that names nothing, or names ids beside All.
func (s Selector) Check() error {
	switch {
	case s.All && (s.Segment != "" || s.Peer != ""):
		return fmt.Errorf(`%w: "all" selects every deadlettered record; give it without "segment" or "peer"`, ErrBadRequest)
	case !s.All && s.Segment == "" && s.Peer == "":
		return fmt.Errorf(`%w: name "segment" and/or "peer", or "all": true for every deadlettered record`, ErrBadRequest)
	}
	return nil
}

// Deadlettered is the reply of the deadletter retry and purge: the
// records acted on, as they were before (state deadletter, with the error
// that deadlettered them), ordered by (segment, peer).
type Deadlettered struct {
	Count   int      `json:"count"`
	Records []Record `json:"records"`
}

// ResendRequest is the body of POST /v1/relay/resend: send Segment to
// Peer again although the ledger may say Peer has it.
type ResendRequest struct {
	Segment string `json:"segment"`
	Peer    string `json:"peer"`
}

// Resent is the reply of POST /v1/relay/resend: the record as it is now
// (scheduled, due at once), and Resent false when it was being sent
// already (inflight: that attempt delivers it).
type Resent struct {
	Record Record `json:"record"`
	Resent bool   `json:"resent"`
}

// TakedownRequest is the body of POST /v1/takedown/evict: evict Segment
// for the takedown request Request (an id of edge/takedown's rule).
type TakedownRequest struct {
	Segment string `json:"segment"`
	Request string `json:"request"`
}

// TakedownReply is the reply of POST /v1/takedown/evict. Evicted is true
// when this call removed the segment, false when it had been taken down
// before (the receipt is then the stored one for this request, or a new
// one for the same eviction). Cancelled counts the delivery records this
// call cancelled. Receipt is one line of a receipt file (docs/takedown.md).
type TakedownReply struct {
	Segment   string    `json:"segment"`
	Request   string    `json:"request"`
	SHA256    string    `json:"sha256"`
	Size      int64     `json:"size"`
	EvictedAt time.Time `json:"evicted_at"`
	Evicted   bool      `json:"evicted"`
	Cancelled int       `json:"cancelled"`
	Receipt   string    `json:"receipt"`
}

// Receipts is the reply of GET /v1/takedown/receipts, in (segment,
// request) order.
type Receipts struct {
	Receipts []Receipt `json:"receipts"`
}

// Receipt is one stored receipt: what it states, and the receipt file line.
type Receipt struct {
	Segment   string    `json:"segment"`
	Request   string    `json:"request"`
	SHA256    string    `json:"sha256"`
	EvictedAt time.Time `json:"evicted_at"`
	Receipt   string    `json:"receipt"`
}

// IngestFile is the JSON body of POST /v1/segments.
type IngestFile struct {
	Path string `json:"path"`
	ID   string `json:"id"`
}

// Ingested is the reply of POST /v1/segments. Duplicate means the segment
// was already stored with the same digest (nothing written).
type Ingested struct {
	Segment   Segment `json:"segment"`
	Duplicate bool    `json:"duplicate"`
}

// ErrorBody is every error reply.
type ErrorBody struct {
	Error string `json:"error"`
}
