package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
)

// Digest reads r to the end and returns the size and lowercase hex SHA-256
// an OFFER announces for it, then rewinds r so the same bytes can be sent.
// The receiver verifies the digest, so a source changed in between is
// refused rather than stored.
func Digest(r io.ReadSeeker) (size int64, sha256hex string, err error) {
	h := sha256.New()
	if size, err = io.Copy(h, r); err != nil {
		return 0, "", fmt.Errorf("digest: %w", err)
	}
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return 0, "", fmt.Errorf("digest: rewind: %w", err)
	}
	return size, hex.EncodeToString(h.Sum(nil)), nil
}
