package relayapi

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	bolt "go.etcd.io/bbolt"
)

// What the agent keeps in edged.db. Every bucket is the agent's alone.
var (
	// holdingsBucket: segment id → reported, for every segment the relay
	// was last told this node holds. An evicted report removes the key.
	holdingsBucket = []byte("edge.holdings")
	// metaBucket: the agent's scalars (the keys below).
	metaBucket = []byte("edge.relayapi")
	// postedBucket: receipt key (segment id NUL request, as edge.receipts)
	// → the relay's verdict on it.
	postedBucket = []byte("edge.receipts.posted")
)

var (
	keyEpoch   = []byte("epoch")   // hex: this database's idempotency key epoch
	keySeq     = []byte("seq")     // decimal: the last batch number used
	keyPending = []byte("pending") // the batch being sent (pendingBatch)
	keyCursor  = []byte("orders.cursor")
)

// reported is what the relay was told of a segment held.
type reported struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// pendingBatch is a holdings batch written before it is sent, so that
// every retry of it, after a lost answer or a restart, sends the same key
// and the same bytes.
type pendingBatch struct {
	Key  string `json:"key"`
	Body []byte `json:"body"`
}

// verdict is what the relay said of a posted receipt.
type verdict struct {
	Accepted bool   `json:"accepted"`
	Status   int    `json:"status"`
	Code     string `json:"code,omitempty"`
	Message  string `json:"message,omitempty"`
	AtMS     int64  `json:"at_ms"`
}

// initState creates the buckets and, for a database that has none, the
// key epoch: 8 random bytes, so that no two databases (a rebuilt one
// after its predecessor) ever use the same idempotency key for different
// batches.
func initState(db *bolt.DB) error {
	return db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{holdingsBucket, metaBucket, postedBucket} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		m := tx.Bucket(metaBucket)
		if m.Get(keyEpoch) != nil {
			return nil
		}
		var e [8]byte
		if _, err := rand.Read(e[:]); err != nil {
			return err
		}
		return m.Put(keyEpoch, []byte(hex.EncodeToString(e[:])))
	})
}

// nextKey takes the next batch number in tx and returns its idempotency
// key: h1.<epoch>.<number>, within the contract's 1..128 bytes of
// [A-Za-z0-9._:/-].
func nextKey(tx *bolt.Tx) (string, error) {
	m := tx.Bucket(metaBucket)
	seq := uint64(0)
	if v := m.Get(keySeq); v != nil {
		n, err := strconv.ParseUint(string(v), 10, 64)
		if err != nil {
			return "", fmt.Errorf("relayapi state: seq %q: %w", v, err)
		}
		seq = n
	}
	seq++
	if err := m.Put(keySeq, []byte(strconv.FormatUint(seq, 10))); err != nil {
		return "", err
	}
	return fmt.Sprintf("h1.%s.%d", m.Get(keyEpoch), seq), nil
}

func getJSON(b *bolt.Bucket, k []byte, v any) (bool, error) {
	raw := b.Get(k)
	if raw == nil {
		return false, nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return false, fmt.Errorf("relayapi state %q: %w", k, err)
	}
	return true, nil
}

func putJSON(b *bolt.Bucket, k []byte, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(k, raw)
}
