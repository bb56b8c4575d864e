package relayserve

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Bearer tokens are stored as SHA-256 digests, not with a slow password
// hash (bcrypt, scrypt, argon2): a token is 160 random bits minted by
// MintToken, not a password a person chose, so guessing it from its digest
// is as hopeless with a fast hash as with a slow one, and a slow hash would
// cost every request tens of milliseconds of CPU, which an unauthenticated
// client could spend at will. No salt is needed for the same reason
// (precomputed tables cannot cover 2^160 inputs). The server keeps the
// digests in a map: looking one up reveals nothing useful through timing,
// because a caller controls the token, not its digest.

// TokenPrefix starts every minted token, so a leaked one is recognisable
// (secret scanners, logs).
const TokenPrefix = "relay_"

// tokenHashPrefix names the digest in the tokens file.
const tokenHashPrefix = "sha256:"

// MintToken returns a new random bearer token for principal and the line
// to add to the tokens file for it. Only the line is stored by the
// server; the token is shown once, to the client's owner.
func MintToken(principal string) (token, line string, err error) {
	if err := checkPrincipalName(principal); err != nil {
		return "", "", err
	}
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	token = TokenPrefix + hex.EncodeToString(b[:])
	return token, principal + " " + HashToken(token), nil
}

// HashToken is a token's digest as the tokens file holds it.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return tokenHashPrefix + hex.EncodeToString(sum[:])
}

// loadTokens reads a tokens file: one "<principal> sha256:<hex>" per line;
// blank lines and lines starting with # are ignored. A principal may have
// several tokens (rotation: add the new one, move clients, delete the old
// line). It returns the principal of each digest and every problem found,
// with its line number. A line naming a principal that principals does
// not list is one of them: its token could authenticate but never do
// anything, which is a mistake (a typo, or a principal not yet added).
func loadTokens(path string, principals map[string]Roles) (map[[sha256.Size]byte]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth.tokens_file: %w", err)
	}
	byHash := map[[sha256.Size]byte]string{}
	var errs []error
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			errs = append(errs, fmt.Errorf("%s:%d: want \"<principal> sha256:<hex>\", got %d fields", path, n, len(fields)))
			continue
		}
		name, digest := fields[0], fields[1]
		if err := checkPrincipalName(name); err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: principal %v", path, n, err))
			continue
		}
		hexSum, ok := strings.CutPrefix(digest, tokenHashPrefix)
		var sum [sha256.Size]byte
		if k, err := hex.Decode(sum[:], []byte(hexSum)); !ok || err != nil || k != sha256.Size || len(hexSum) != 2*sha256.Size {
			errs = append(errs, fmt.Errorf("%s:%d: digest must be sha256: and 64 hex digits (relay serve token prints the line)", path, n))
			continue
		}
		if _, ok := principals[name]; !ok {
			errs = append(errs, fmt.Errorf("%s:%d: principal %q is not under principals in the configuration: add it there with its roles, or remove this line (to revoke a principal, remove it from both)", path, n, name))
			continue
		}
		if prev, dup := byHash[sum]; dup {
			errs = append(errs, fmt.Errorf("%s:%d: the same token digest is already given to %q", path, n, prev))
			continue
		}
		byHash[sum] = name
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", path, err))
	}
	return byHash, errors.Join(errs...)
}
