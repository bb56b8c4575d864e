package relayserve

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
)

// credentials are what a request is judged by and what the listener
// presents: the authenticator (tokens file, client CA, principals and
// their roles, anonymous access) and the server's certificate. A reload
// (reload.go) swaps them whole. The TLS file paths are fixed at start:
// whether the listener speaks TLS and asks for client certificates is
// decided once, so changing them needs a restart.
type credentials struct {
	tls  TLS
	auth atomic.Pointer[authenticator]
	cert atomic.Pointer[tls.Certificate]
}

// loadCredentials loads everything the configuration names.
func loadCredentials(cfg Config) (*credentials, error) {
	c := &credentials{tls: cfg.TLS}
	return c, c.reload(cfg)
}

// reload replaces the credentials with those cfg describes and the files'
// current content, all or nothing: on any error the ones in use stay.
// cfg's TLS paths must be the ones loadCredentials was given (the
// reloader refuses a configuration that changes them).
func (c *credentials) reload(cfg Config) error {
	a, err := newAuthenticator(cfg)
	var cert *tls.Certificate
	if c.tls.Cert != "" && c.tls.Key != "" { // half a pair is a configuration error of its own
		kp, cerr := tls.LoadX509KeyPair(c.tls.Cert, c.tls.Key)
		if cerr == nil {
			cerr = serverUsage(kp.Leaf)
		}
		if cerr != nil {
			err = errors.Join(err, fmt.Errorf("tls.cert, tls.key: %w", cerr))
		}
		cert = &kp
	}
	if err != nil {
		return err
	}
	c.auth.Store(a)
	c.cert.Store(cert)
	return nil
}

// tlsConfig is the listener's TLS configuration (nil: plain HTTP). The
// certificate is read per handshake, so a reload reaches new connections.
func (c *credentials) tlsConfig() *tls.Config {
	if c.tls.Cert == "" {
		return nil
	}
	tc := &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.cert.Load(), nil
		},
	}
	if c.tls.ClientCA != "" {
		// The certificate is requested and its possession proven by the
		// handshake, but verified against tls.client_ca per request, so
		// a bad certificate gets a 401 that says why rather than a bare
		// TLS alert, and a bearer token works on the same listener.
		tc.ClientAuth = tls.RequestClientCert
	}
	return tc
}

// serverUsage refuses a certificate that clients would refuse as a
// server's (its extended key usage lacks server auth, like a client
// certificate from `edgectl pki issue --usage client`), at the start or
// reload rather than in every client's handshake.
func serverUsage(leaf *x509.Certificate) error {
	if leaf == nil || len(leaf.ExtKeyUsage) == 0 && len(leaf.UnknownExtKeyUsage) == 0 {
		return nil
	}
	if slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny) {
		return nil
	}
	return errors.New("the certificate is not valid for server auth (a client certificate?): issue the server its own, e.g. edgectl pki issue NAME --usage server --host NAMES")
}
