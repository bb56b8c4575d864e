package takedowns

import (
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/relay-dev/relay/relaycore"
)

// Namespace starts every source and target partition the package writes.
// The API refuses it in producer routes (rows, sources and target reads),
// so no producer can forge a holder report, an order or a receipt: only
// this package's own calls write under it.
const Namespace = "takedown:"

// ControlSource is the source of every row the package enqueues except
// holder reports: one producer for the takedown, order, open and receipt
// keys, so its seqs order every change to them.
const ControlSource relaycore.Partition = Namespace + "control"

// OpenTarget lists the takedowns the owner watches (key: the takedown id).
const OpenTarget relaycore.Partition = Namespace + "open"

// HolderShards is how many partitions the holder index is spread over.
// Fixed for good: a content id's shard is part of where its records live.
// 32 keeps a batch of 500 reports within DynamoDB's 100 items per
// transaction (one row page per shard touched, plus the full pages), and
// each node's source keeps at most 32 target records.
const HolderShards = 32

const (
	holdingsPrefix = Namespace + "holdings/"
	holdersPrefix  = Namespace + "holders/"
	takedownPrefix = Namespace + "td/"
	ordersPrefix   = Namespace + "orders/"
)

// HoldingsSource is the source node's holder reports are enqueued to.
func HoldingsSource(node string) relaycore.Partition {
	return relaycore.Partition(holdingsPrefix + node)
}

// HoldersTarget is the holder index shard of content: FNV-1a 32 of the
// content id modulo HolderShards.
func HoldersTarget(content string) relaycore.Partition {
	h := fnv.New32a()
	h.Write([]byte(content))
	return relaycore.Partition(fmt.Sprintf("%s%02d", holdersPrefix, h.Sum32()%HolderShards))
}

// TakedownTarget is the partition of takedown id.
func TakedownTarget(id string) relaycore.Partition { return relaycore.Partition(takedownPrefix + id) }

// OrdersTarget is node's order partition.
func OrdersTarget(node string) relaycore.Partition { return relaycore.Partition(ordersPrefix + node) }

// Reserved reports whether a source or target name is the package's.
func Reserved(name string) bool { return strings.HasPrefix(name, Namespace) }

// Keys within the partitions.
const (
	keyMeta      = "meta"
	orderedPfx   = "ordered/"
	receiptPfx   = "receipt/"
	waivePfx     = "waive/"
	orderReqPfx  = "r/"
	orderSeqPfx  = "o/"
	orderForPfx  = "t/"
	reportAtTail = "/at"
)

func holderKey(content, node string) string { return content + "/" + node }

// requestSuffix is the per-holder request id: relaycore's takedown key
// suffix, "<content>/<node>/<requested ms, 19 digits>".
func requestSuffix(t relaycore.ContentTakedownV1) string {
	return fmt.Sprintf("%s/%s/%019d", t.ContentID, t.LateHolder, t.RequestedMS)
}
