package relayserve

import (
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"
)

// credentials are what SIGHUP reloads without a restart: the tokens file,
// the client CA and the server's certificate. Roles (principals) stay as
// the configuration said at start.
type credentials struct {
	cfg  Config
	auth atomic.Pointer[authenticator]
	cert atomic.Pointer[tls.Certificate]
}

// loadCredentials loads everything the configuration names.
func loadCredentials(cfg Config) (*credentials, error) {
	c := &credentials{cfg: cfg}
	return c, c.reload()
}

// reload replaces the credentials with the files' current content, all
// or nothing: on any error the ones in use stay.
func (c *credentials) reload() error {
	a, err := newAuthenticator(c.cfg)
	var cert *tls.Certificate
	if c.cfg.TLS.Cert != "" && c.cfg.TLS.Key != "" { // half a pair is a configuration error of its own
		kp, cerr := tls.LoadX509KeyPair(c.cfg.TLS.Cert, c.cfg.TLS.Key)
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
	if c.cfg.TLS.Cert == "" {
		return nil
	}
	tc := &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.cert.Load(), nil
		},
	}
	if c.cfg.TLS.ClientCA != "" {
		// The certificate is requested and its possession proven by the
		// handshake, but verified against tls.client_ca per request, so
		// a bad certificate gets a 401 that says why rather than a bare
		// TLS alert, and a bearer token works on the same listener.
		tc.ClientAuth = tls.RequestClientCert
	}
	return tc
}
