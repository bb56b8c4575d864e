package relaycore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// IdemPrefix starts the idempotency records of a source partition:
// IdemPrefix + key. It sorts after "rs" ('x' > 'r'), so neither the enqueue
// snapshot scan ["alarm", "os\x00") nor the page range ["r/", "r0") ever
// reads these records.
const IdemPrefix = "x/idem/"

const idemEnd = "x/idem0" // first key after every idempotency record ('0' follows '/')

// MaxIdempotencyKeyLen bounds EnqueueOptions.IdempotencyKey.
const MaxIdempotencyKeyLen = 128

// defaultIdempotencyTTL is how long an idempotency record answers retries
// when RelayHandler.IdempotencyTTL is zero.
const defaultIdempotencyTTL = 24 * time.Hour

// idemGCPerAlarm bounds the expired idempotency records one alarm deletes,
// and idemGCScan the records it looks at to find them, so the clean-up
// never costs an alarm more than one small Query and a few batch items.
const (
	idemGCPerAlarm = 16
	idemGCScan     = 64
)

// ValidIdempotencyKey reports why key cannot be an idempotency key, or nil:
// 1..128 bytes of [A-Za-z0-9._:-], so it can be a store key, an HTTP header
// value and a log field without escaping.
func ValidIdempotencyKey(key string) error {
	if key == "" || len(key) > MaxIdempotencyKeyLen {
		return fmt.Errorf("%w: idempotency key must be 1..%d bytes, got %d", ErrInvalidIdempotencyKey, MaxIdempotencyKeyLen, len(key))
	}
	for i := 0; i < len(key); i++ {
		if !idemKeyByte(key[i]) {
			return fmt.Errorf("%w: idempotency key byte %d (%q) is not one of [A-Za-z0-9._:-]", ErrInvalidIdempotencyKey, i, key[i])
		}
	}
	return nil
}

func idemKeyByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-'
}

// idemRecord is the value of an idempotency record (docs/layout.md).
type idemRecord struct {
	V         int      `json:"v"`
	Digest    string   `json:"digest"`
	Seqs      []uint64 `json:"seqs"`
	CommitMS  int64    `json:"commit_ms"`
	ExpiresMS int64    `json:"expires_ms"`
}

func decodeIdem(key string, raw []byte) (idemRecord, error) {
	var r idemRecord
	if err := json.Unmarshal(raw, &r); err != nil || r.V != 1 || r.Digest == "" {
		return idemRecord{}, fmt.Errorf("%w: %s %q", ErrCorruptRecord, key, raw)
	}
	return r, nil
}

// rowsDigest is the sha256 of a canonical encoding of rows: for each row,
// its target, its puts (key, value) and its deletes, every string
// length-prefixed (uvarint) and every list count-prefixed, so two inputs
// have one digest only when they are the same rows in the same order.
func rowsDigest(rows []Row) string {
	h := sha256.New()
	var buf []byte
	str := func(s []byte) {
		buf = binary.AppendUvarint(buf[:0], uint64(len(s)))
		h.Write(buf)
		h.Write(s)
	}
	count := func(n int) {
		buf = binary.AppendUvarint(buf[:0], uint64(n))
		h.Write(buf)
	}
	count(len(rows))
	for _, r := range rows {
		str([]byte(r.Target))
		count(len(r.Puts))
		for _, kv := range r.Puts {
			str([]byte(kv.Key))
			str(kv.Value)
		}
		count(len(r.Deletes))
		for _, k := range r.Deletes {
			str([]byte(k))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// errIdemTaken is commitBatch's report that the idempotency precondition
// failed: the record was written (or rewritten) since it was read.
var errIdemTaken = errors.New("idempotency record changed")

// commitIdempotent is commitRelayRows with cfg.IdempotencyKey set: the rows
// commit in one batch together with the idempotency record, or a live
// record with the same digest answers with its seqs (Replayed) and nothing
// is written.
func commitIdempotent(ctx context.Context, st Store, clock Clock, source Partition, lease *Lease, deadline time.Time, rows []Row, cfg EnqueueConfig, res *CommitResult) error {
	key := IdemPrefix + cfg.IdempotencyKey
	digest := rowsDigest(rows)
	ttl := cfg.IdempotencyTTL
	if ttl <= 0 {
		ttl = defaultIdempotencyTTL
	}
	caps := st.Capabilities()
	maxReplans := cfg.MaxReplans
	if maxReplans <= 0 {
		maxReplans = 64
	}
	// The first attempt assumes the key is new (no read); a failed guard
	// tells otherwise, and the record is read then.
	guard := Precondition{Key: key, Absent: true}
	for {
		snap, err := ReadEnqueueSnapshot(ctx, st, source, lease, deadline, clock.Now(), cfg)
		if err != nil {
			return err
		}
		if err := snap.ReadTargets(ctx, st, rows); err != nil {
			return err
		}
		plan, err := planEnqueue(snap, rows, caps, cfg)
		if err != nil {
			return err
		}
		if len(plan) != 1 {
			return fmt.Errorf("enqueue %s: %d rows need %d batches: %w", source, len(rows), len(plan), ErrIdempotentRequestTooLarge)
		}
		b := plan[0]
		rec := idemRecord{V: 1, Digest: digest, Seqs: make([]uint64, len(rows)), CommitMS: b.CommitMS, ExpiresMS: b.CommitMS + ttl.Milliseconds()}
		for k, ri := range b.Rows {
			rec.Seqs[ri] = b.FirstSeq + uint64(k)
		}
		b.idemKey, b.idemValue = key, encodeJSON(rec)
		// The guard goes first: stores name the first precondition found
		// false, and on a retry os has usually moved on too, so a later
		// guard would cost a re-plan before the replay is noticed.
		b.Batch.Preconditions = append([]Precondition{guard}, b.Batch.Preconditions...)
		b.Batch.Writes = append(b.Batch.Writes, Write{Key: key, Value: b.idemValue})
		if err := caps.Check(source, b.Batch); err != nil {
			if errors.Is(err, ErrBatchTooLarge) || errors.Is(err, ErrValueTooLarge) {
				return fmt.Errorf("enqueue %s: the rows and the idempotency record do not fit one batch (%v): %w", source, err, ErrIdempotentRequestTooLarge)
			}
			return fmt.Errorf("plan enqueue %s: %w", source, err)
		}
		landed, err := commitBatch(ctx, st, clock, source, b)
		switch {
		case err == nil && landed:
			res.Seqs, res.Batches, res.AlarmDueMS, res.armed = rec.Seqs, 1, b.AlarmDueMS, b.armsAlarm
			res.backingOff = b.backingOff
			return nil
		case errors.Is(err, errIdemTaken):
			raw, found, gerr := st.Get(ctx, source, key)
			if gerr != nil {
				return fmt.Errorf("enqueue %s: read %s: %w", source, key, gerr)
			}
			if !found {
				guard = Precondition{Key: key, Absent: true}
				break // deleted (expired, collected) since: try again
			}
			cur, derr := decodeIdem(key, raw)
			if derr != nil {
				return fmt.Errorf("enqueue %s: %w", source, derr)
			}
			if cur.ExpiresMS > unixMS(clock.Now()) {
				if cur.Digest != digest || len(cur.Seqs) != len(rows) {
					return fmt.Errorf("enqueue %s: key %q: %w", source, cfg.IdempotencyKey, ErrIdempotencyKeyReused)
				}
				res.Seqs, res.Replayed = cur.Seqs, true
				return nil
			}
			// Expired: the key is free again; overwrite exactly this record.
			guard = Precondition{Key: key, Value: raw}
		case err != nil:
			return err
		}
		res.Replans++
		if res.Replans > maxReplans {
			return fmt.Errorf("commit relay rows %s: %w", source, ErrContention)
		}
	}
}

// expiredIdem finds up to idemGCPerAlarm expired idempotency records of
// source among at most idemGCScan, starting at a point of the key range
// that changes with the clock (and wrapping) so that live records early in key order cannot hide
// expired ones behind them for ever. It returns the guards (each record's
// exact value, so a record rewritten meanwhile is kept) and the deletes,
// within used items and bytes already in the batch they join.
//
// It reads the whole range first, one page of idemGCScan from its start:
// a source with fewer records than that (most have none) costs one scan,
// its records looked at from the pivot on and then wrapping. A source with
// more scans from the pivot on as well, and takes the records before the
// pivot from that first page (they are the range's first keys), so it
// costs no more scans than starting at the pivot would.
func expiredIdem(ctx context.Context, st Store, source Partition, nowMS int64, usedItems, usedBytes int) ([]Precondition, []Write, error) {
	caps := st.Capabilities()
	// The clock picks the start point: it moves between alarms, and the
	// engine's traces stay deterministic under a simulated clock.
	const alphabet = "-.0123456789:ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"
	pivot := IdemPrefix + string(alphabet[uint64(nowMS)%uint64(len(alphabet))])
	var pres []Precondition
	var dels []Write
	left := idemGCScan
	// take looks at one record; false: the batch is full.
	take := func(it Item) bool {
		left--
		rec, err := decodeIdem(it.Key, it.Value)
		if err != nil || rec.ExpiresMS > nowMS || len(dels) == idemGCPerAlarm {
			return true // never delete what cannot be read
		}
		size := caps.ItemSize(source, it.Key, 0)
		if (caps.MaxBatchItems > 0 && usedItems+1 > caps.MaxBatchItems) || (caps.MaxBatchBytes > 0 && usedBytes+size > caps.MaxBatchBytes) {
			return false
		}
		usedItems, usedBytes = usedItems+1, usedBytes+size
		pres = append(pres, Precondition{Key: it.Key, Value: bytes.Clone(it.Value)})
		dels = append(dels, Write{Key: it.Key, Delete: true})
		return true
	}
	first, err := st.Scan(ctx, source, ScanRequest{Start: IdemPrefix, End: idemEnd, Limit: idemGCScan})
	if err != nil {
		return nil, nil, fmt.Errorf("scan idempotency records %s: %w", source, err)
	}
	// Records before the pivot, in key order: the first page's.
	var before []Item
	for i, it := range first.Items {
		if it.Key >= pivot {
			before = first.Items[:i]
			break
		}
		before = first.Items[:i+1]
	}
	if first.Next == "" {
		// Every record is in the first page: from the pivot on, then
		// wrapping.
		for _, it := range first.Items[len(before):] {
			if !take(it) {
				return pres, dels, nil
			}
		}
	} else {
		after := ""
		for left > 0 && len(dels) < idemGCPerAlarm {
			pg, err := st.Scan(ctx, source, ScanRequest{Start: pivot, End: idemEnd, After: after, Limit: left})
			if err != nil {
				return nil, nil, fmt.Errorf("scan idempotency records %s: %w", source, err)
			}
			for _, it := range pg.Items {
				if !take(it) {
					return pres, dels, nil
				}
			}
			if pg.Next == "" {
				break
			}
			after = pg.Next
		}
	}
	for _, it := range before {
		if left <= 0 || len(dels) == idemGCPerAlarm {
			break
		}
		if !take(it) {
			break
		}
	}
	return pres, dels, nil
}
