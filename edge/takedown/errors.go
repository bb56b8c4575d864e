package takedown

import "errors"

// Errors of Parse, ParseLine and Verify. Each refusal wraps exactly one of
// them, so a caller (the relay, edgectl takedown verify) can say why a
// receipt was refused without matching text.
var (
	// ErrMalformed: the bytes are not a canonical version-1 receipt or
	// receipt line, or a field breaks its rule.
	ErrMalformed = errors.New("malformed receipt")
	// ErrSignature: the signature does not verify under the certificate's
	// key (a changed receipt, another key), or the key type is not ECDSA
	// or Ed25519.
	ErrSignature = errors.New("receipt signature does not verify")
	// ErrChain: the certificate does not chain to the given roots at
	// evicted_at (another CA, expired or not yet valid then).
	ErrChain = errors.New("receipt certificate not issued by a trusted CA")
	// ErrNode: the certificate names another node than the receipt, or no
	// single node.
	ErrNode = errors.New("receipt certificate is another node's")
	// ErrUsage: the certificate is not a node certificate (valid for both
	// client and server authentication, and for digital signatures).
	ErrUsage = errors.New("receipt certificate is not a node certificate")
	// ErrFuture: evicted_at is later than the verifier's clock allows.
	ErrFuture = errors.New("receipt dated in the future")
)
