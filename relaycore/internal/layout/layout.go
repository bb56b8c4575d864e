// Package layout names the keys of the engine's records that only relaycore
// and its simulation (relaycore/sim) address: the source lease, the row
// pages, the hold summary and the per-target records (docs/layout.md
// describes every key and its encoding). The keys that other packages read
// (KeyAlarm, KeyOS, KeyRS, RHKey, ReservedPrefix, IdemPrefix) are
// relaycore's own exported names; these are not part of its API.
package layout

import "fmt"

// Source partition keys besides relaycore's KeyAlarm, KeyOS and KeyRS, in
// key order with them: alarm < lease < os < r/... < rs, so the row pages form
// one contiguous range [PagePrefix, PageEnd) and a scan from the start of the
// partition meets os before the first page.
const (
	KeyLease   = "lease" // optional source lease, JSON
	PagePrefix = "r/"    // row pages: "r/" + 16 lowercase hex digits of the page's original first seq
	PageEnd    = "r0"    // first key after every page key ('0' follows '/')
)

// PageKey is the key of the page whose original first row has seq first. A
// partially delivered page is rewritten under the same key, so the key is a
// lower bound of the page's first seq, and key order is seq order.
func PageKey(first uint64) string { return PagePrefix + fmt.Sprintf("%016x", first) }

// Per-target delivery state, held rows, retry markers and the dead-row
// archive live in the source partition, after rs:
//
//	q                        hold summary of the source (one record)
//	t/<hex target>/e         what enqueuers committed for the target
//	t/<hex target>/s         the target's delivery state (fires, operators)
//	u/<hex target>/<16 hex>  held pages: rows moved out of the outbox scan
//	v/<16 hex due>/<hex t>   retry marker of a target whose held rows are due
//	w/<16 hex id>            dead-row archive entry (one per skip)
//	w/<16 hex id>/<16 hex>   the skipped rows, as pages
//
// Target names are any bytes, so keys carry them as lowercase hex: hex keeps
// byte order (a listing is sorted by target name) and cannot contain the
// "/" that separates the parts. Each End is the first key after its range.
const (
	KeyHold      = "q"
	TargetPrefix = "t/"
	HeldPrefix   = "u/"
	RetryPrefix  = "v/"
	DeadPrefix   = "w/"
	TargetEnd    = "t0"
	HeldEnd      = "u0"
	RetryEnd     = "v0"
	DeadEnd      = "w0"
)
