// Package takedown is the edge agent's proof of a takedown: a receipt that
// node N evicted content C (digest D) for request R at time T, signed with
// N's own node key and carrying N's certificate, so that anyone holding only
// the CA certificate can check it offline (`edgectl takedown verify`), and
// the relay can check it before it counts the holder as done.
//
// It depends on nothing but the standard library, edge/wire (identifier
// rules) and edge/pki (identity in certificates): no relaycore, no AWS, no
// database, so the relay and third-party tools can import it.
//
// # The receipt
//
// Receipt.Canonical is the signed message: six lines, each ending in "\n",
// in this order and nothing else:
//
//	relay-takedown-receipt/1
//	request=<request id>
//	content_id=<segment id>
//	sha256=<64 lowercase hex digits>
//	node=<node id>
//	evicted_at=<UTC time as 2006-01-02T15:04:05.000000000Z>
//
// The first line names the format and its version; a later version gets a
// new first line, so a receipt can never be read as another version's. The
// content id and node follow edge/wire's identifier rules, the request id
// RequestID's (it may contain '/' and ':', so relaycore's takedown keys
// fit). None of the fields may contain a space, '=' or a line break, so the
// message has exactly one encoding: Parse refuses anything that does not
// re-encode to the same bytes.
//
// # The signature
//
// The node's private key signs the canonical bytes: an ECDSA key (what
// edgectl pki issues: P-256) signs their SHA-256 (ASN.1 DER signature, as
// x509.ECDSAWithSHA256; deterministic, RFC 6979, so a receipt signed
// twice has the same bytes), an Ed25519 key the bytes themselves. The algorithm
// follows from the certificate's key, so a receipt names none that could be
// swapped. Other key types are refused.
//
// # Verification (Verify)
//
// A receipt is accepted only if all of these hold: the line is exactly the
// canonical encoding of what it carries; the leaf certificate's identity
// URI (pki.NodeID) names the receipt's node; the certificate chains to one
// of the given roots, through the intermediates the receipt carries, valid
// for both client and server authentication (a node certificate, as edged
// requires of its own; a client-only or server-only certificate of the same
// CA cannot sign a receipt) and, if it has a key usage, for digital
// signatures; the signature verifies under the certificate's key; and
// evicted_at is no later than the verifier's clock plus MaxClockSkew.
//
// The chain is checked at evicted_at, not now: a receipt is evidence of
// something done at that moment and must stay checkable after the node's
// certificate (one year from edgectl pki) expires. The price is that a key
// stolen after its certificate expired could sign receipts backdated into
// the certificate's lifetime; the relay, which receives receipts as they are
// made, additionally refuses one dated before its request or far from its own
// clock. The dev CA has no revocation; a verifier with a CRL checks it on the
// chain Verify returns.
//
// # The file of receipts
//
// A set of receipts (what the relay exports for a takedown, what
// `edgectl takedown receipts --json` prints) is JSON lines: one Signed per
// line, each line the canonical JSON encoding of Signed.MarshalLine,
//
//	{"v":1,"receipt":"relay-takedown-receipt/1\nrequest=…\n…","signature":"<base64>","chain":["<base64 DER>",…]}
//
// keys in that order, no spaces, leaf certificate first. ParseLine refuses a
// line that is not exactly that encoding (another key order, case or
// spacing, an unknown key, non-canonical base64), so any changed byte of a
// line either fails to parse or fails the signature or the chain.
package takedown
