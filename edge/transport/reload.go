package transport

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/relay-dev/relay/edge/pki"
)

// Material is one consistent set of TLS credentials: this node's
// certificate and key, and the CA pool peers are verified against.
type Material struct {
	Cert   tls.Certificate // Leaf is set
	Pool   *x509.CertPool
	NodeID string // from Cert; always equals the configured node id
}

// Reloader keeps the current Material for a certificate, key and CA file,
// and replaces it when the files change, without a restart.
//
// Current, called on every TLS handshake, compares each file's size,
// modification time, inode and change time with what it last saw; only
// when one differs does it read the files, and only when their content hash
// differs from the material in use does it parse them. File timestamps are
// coarse (a jiffy, or a second on some file systems), so a rewrite soon
// after a look could keep the same stamp; as git does for its index, stamps
// younger than racyMargin at the time of the look are not trusted and the
// files are read and hashed again on each call until they are older. So a
// change is always seen by the next handshake. Reload reads unconditionally
// (the daemon calls it on SIGHUP).
//
// New material is accepted only whole and valid: the key matches the
// certificate, the CA file holds at least one certificate, the certificate
// verifies against that CA for both client and server use at the time of
// loading, and it names the configured node. Otherwise the old material
// stays in use and the error is reported (Reload's result, the OnError
// callback for automatic checks, and Err), once per change of the files.
// Rotating files one at a time is therefore safe: the intermediate states
// fail validation and the final one is picked up.
type Reloader struct {
	nodeID                    string
	certFile, keyFile, caFile string
	onError                   func(error)
	onLoad                    func(*x509.Certificate)
	now                       func() time.Time

	mu      sync.Mutex
	cur     *Material
	curSum  [sha256.Size]byte // content hash of cur's files
	seen    [3]fileStamp      // stat of the files at the last look
	racy    bool              // seen was too close to the look to trust
	seenSum [sha256.Size]byte // content hash at the last look, loaded or not
	lastErr error
	// ioReported is the text of the last stat or read failure reported by
	// Current, so a file that stays missing is reported once.
	ioReported string
}

// File roles in a FileError.
const (
	RoleCert = "cert" // this node's certificate chain
	RoleKey  = "key"  // its private key
	RoleCA   = "ca"   // the CA bundle
)

// FileError says which of the three files a load failed on, so a caller
// can name it the way its configuration does (edged: tls.cert, tls.key,
// tls.ca). A stat that fails for several files is an errors.Join of one
// FileError each.
type FileError struct {
	Role string // RoleCert, RoleKey or RoleCA
	Path string
	Err  error
}

func (e *FileError) Error() string { return e.Err.Error() }
func (e *FileError) Unwrap() error { return e.Err }

// FileErrors lists the FileErrors in err's tree, in order.
func FileErrors(err error) []*FileError {
	var out []*FileError
	var walk func(error)
	walk = func(err error) {
		if fe, ok := err.(*FileError); ok {
			out = append(out, fe)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			if e := u.Unwrap(); e != nil {
				walk(e)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

// racyMargin exceeds the coarsest common timestamp granularity (FAT: 2 s).
const racyMargin = 2 * time.Second

type fileStamp struct {
	size, ino    int64
	mtime, ctime time.Time
}

func stamp(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	s := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	s.ino, s.ctime = inodeAndCtime(fi)
	return s, nil
}

// NewReloader loads the files once; an error here means there is no
// material to fall back on, so the caller must not start. onError may be
// nil.
func NewReloader(nodeID, certFile, keyFile, caFile string, onError func(error)) (*Reloader, error) {
	return newReloader(nodeID, certFile, keyFile, caFile, onError, nil)
}

// newReloader is NewReloader with onLoad, told of each certificate put
// in use after the first (by Current or Reload), once per change.
func newReloader(nodeID, certFile, keyFile, caFile string, onError func(error), onLoad func(*x509.Certificate)) (*Reloader, error) {
	r := &Reloader{nodeID: nodeID, certFile: certFile, keyFile: keyFile, caFile: caFile, onError: onError, onLoad: onLoad, now: time.Now}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Current returns the material to use for a handshake now, picking up
// changed files first. It never fails: a bad change keeps the old material.
func (r *Reloader) Current() *Material {
	r.mu.Lock()
	defer r.mu.Unlock()
	stamps, err := r.stamps()
	if err == nil && stamps == r.seen && !r.racy {
		return r.cur
	}
	if err == nil {
		err = r.reloadLocked(false)
	} else {
		r.lastErr = err
		r.seen = [3]fileStamp{} // read them again once they are back
	}
	// A file that cannot be stat'ed or read (removed mid-rotation,
	// unreadable) fails every look until it changes; report it once, as a
	// bad file is reported once, not on every handshake.
	if pe := new(fs.PathError); errors.As(err, &pe) {
		if err.Error() == r.ioReported {
			return r.cur
		}
		r.ioReported = err.Error()
	} else {
		r.ioReported = ""
	}
	if err != nil && r.onError != nil {
		r.onError(err)
	}
	return r.cur
}

// Reload re-reads the files now, whatever their timestamps say, and
// switches to them if they are valid. On error the previous material
// stays in use.
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reloadLocked(true)
}

// Err is the error of the last load attempt, nil if it succeeded or the
// files were unchanged.
func (r *Reloader) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

// files pairs the three paths with their roles.
func (r *Reloader) files() [3][2]string {
	return [3][2]string{{RoleCert, r.certFile}, {RoleKey, r.keyFile}, {RoleCA, r.caFile}}
}

// stamps looks at all three files and reports every one that fails: the
// ones it cannot stat and, beside them, what the others' content alone
// shows (pemProblem), so one run names every bad file.
func (r *Reloader) stamps() ([3]fileStamp, error) {
	var s [3]fileStamp
	var errs [3]error
	failed := false
	for i, f := range r.files() {
		st, err := stamp(f[1])
		if err != nil {
			errs[i], failed = &FileError{Role: f[0], Path: f[1], Err: err}, true
		}
		s[i] = st
	}
	if !failed {
		return s, nil
	}
	for i, f := range r.files() {
		if errs[i] != nil {
			continue
		}
		if raw, err := os.ReadFile(f[1]); err != nil {
			errs[i] = &FileError{Role: f[0], Path: f[1], Err: err}
		} else {
			errs[i] = r.pemProblem(f[0], raw)
		}
	}
	return s, fmt.Errorf("reload tls files: %w", errors.Join(errs[:]...))
}

// pemProblem is the check of one file's content that needs no other file:
// the PEM blocks it must hold.
func (r *Reloader) pemProblem(role string, raw []byte) error {
	switch role {
	case RoleCert:
		if !hasPEM(raw, func(t string) bool { return t == "CERTIFICATE" }) {
			return &FileError{Role: RoleCert, Path: r.certFile, Err: fmt.Errorf("load %s: no PEM certificate", r.certFile)}
		}
	case RoleKey:
		if !hasPEM(raw, func(t string) bool { return strings.HasSuffix(t, "PRIVATE KEY") }) {
			return &FileError{Role: RoleKey, Path: r.keyFile, Err: fmt.Errorf("load %s: no PEM private key", r.keyFile)}
		}
	case RoleCA:
		if !x509.NewCertPool().AppendCertsFromPEM(raw) {
			return &FileError{Role: RoleCA, Path: r.caFile, Err: fmt.Errorf("load %s: no PEM certificates", r.caFile)}
		}
	}
	return nil
}

// reloadLocked reads the files and switches material if their content
// changed and is valid. Without force, content that already failed to load
// is not reported again.
func (r *Reloader) reloadLocked(force bool) error {
	stamps, err := r.stamps()
	if err != nil {
		r.lastErr = err
		return err
	}
	var raw [3][]byte
	h := sha256.New()
	for i, f := range r.files() {
		if raw[i], err = os.ReadFile(f[1]); err != nil {
			err = fmt.Errorf("reload tls files: %w", &FileError{Role: f[0], Path: f[1], Err: err})
			r.lastErr = err
			return err
		}
		fmt.Fprintf(h, "%d:", len(raw[i]))
		h.Write(raw[i])
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	r.seen = stamps
	r.racy = false
	look := r.now()
	for _, st := range stamps {
		if !look.After(st.mtime.Add(racyMargin)) || !look.After(st.ctime.Add(racyMargin)) {
			r.racy = true
		}
	}
	switch {
	case r.cur != nil && sum == r.curSum:
		r.seenSum, r.lastErr = sum, nil
		return nil // touched but unchanged
	case !force && sum == r.seenSum:
		return nil // the same bad content; already reported
	}
	r.seenSum = sum
	m, err := r.parse(raw[0], raw[1], raw[2])
	if err != nil {
		if r.cur != nil {
			err = fmt.Errorf("%w (still using the previous certificate)", err)
		}
		r.lastErr = err
		return err
	}
	first := r.cur == nil
	r.cur, r.curSum, r.lastErr = m, sum, nil
	if !first && r.onLoad != nil {
		r.onLoad(m.Cert.Leaf)
	}
	return nil
}

// parse checks the files' content; an error is a *FileError naming the
// file at fault (the certificate when the key does not match it).
func (r *Reloader) parse(certPEM, keyPEM, caPEM []byte) (*Material, error) {
	fail := func(role, path string, format string, args ...any) error {
		return &FileError{Role: role, Path: path, Err: fmt.Errorf(format, args...)}
	}
	// Every file whose content alone is wrong, at once.
	if err := errors.Join(r.pemProblem(RoleCert, certPEM), r.pemProblem(RoleKey, keyPEM), r.pemProblem(RoleCA, caPEM)); err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fail(RoleKey, r.keyFile, "load %s with %s: %w", r.certFile, r.keyFile, err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	id, err := pki.NodeID(cert.Leaf)
	if err != nil {
		return nil, fail(RoleCert, r.certFile, "load %s: %w", r.certFile, err)
	}
	if id != r.nodeID {
		return nil, fail(RoleCert, r.certFile, "load %s: %w: certificate is for node %q, this node is %q", r.certFile, ErrIdentityMismatch, id, r.nodeID)
	}
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth} {
		_, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: r.now(), KeyUsages: []x509.ExtKeyUsage{usage}})
		if err != nil {
			return nil, fail(RoleCert, r.certFile, "load %s: not valid under %s for %v: %w", r.certFile, r.caFile, usageName(usage), err)
		}
	}
	return &Material{Cert: cert, Pool: pool, NodeID: id}, nil
}

// hasPEM reports whether data holds a PEM block whose type is wanted (what
// tls.X509KeyPair looks for, told apart so the error names the file).
func hasPEM(data []byte, want func(string) bool) bool {
	for {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			return false
		}
		if want(b.Type) {
			return true
		}
	}
}

func usageName(u x509.ExtKeyUsage) string {
	if u == x509.ExtKeyUsageClientAuth {
		return "client auth"
	}
	return "server auth"
}
