package relayserve

import (
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/relay-dev/relay/edge/pki"
)

// AnonymousPrincipal is the caller name of requests without credentials
// when auth.anonymous allows them; it is also the actor operator actions
// record for them.
const AnonymousPrincipal = "anonymous"

// authenticator turns a request's credentials into a principal and its
// roles.
type authenticator struct {
	tokens     map[[sha256.Size]byte]string // principal by token digest; nil: tokens off
	clientCAs  *x509.CertPool               // nil: client certificates off
	principals map[string]Roles
	anonymous  *Roles
}

// authError is a refusal before the API handler runs: 401 (who are you?)
// or 403 (you may not).
type authError struct {
	status  int
	code    string
	message string
}

func unauthenticated(format string, args ...any) *authError {
	return &authError{http.StatusUnauthorized, "unauthenticated", fmt.Sprintf(format, args...)}
}

func forbidden(format string, args ...any) *authError {
	return &authError{http.StatusForbidden, "forbidden", fmt.Sprintf(format, args...)}
}

func newAuthenticator(cfg Config) (*authenticator, error) {
	a := &authenticator{principals: cfg.Principals, anonymous: cfg.Auth.Anonymous}
	var errs []error
	if cfg.Auth.TokensFile != "" {
		tokens, err := loadTokens(cfg.Auth.TokensFile, cfg.Principals)
		if err != nil {
			errs = append(errs, err)
		}
		a.tokens = tokens
	}
	if cfg.TLS.ClientCA != "" {
		pem, err := os.ReadFile(cfg.TLS.ClientCA)
		if err != nil {
			errs = append(errs, fmt.Errorf("tls.client_ca: %w", err))
		} else {
			a.clientCAs = x509.NewCertPool()
			if !a.clientCAs.AppendCertsFromPEM(pem) {
				errs = append(errs, fmt.Errorf("tls.client_ca %s: no PEM certificate in it", cfg.TLS.ClientCA))
			}
		}
	}
	return a, errors.Join(errs...)
}

// authenticate names the caller. A request presenting a credential is
// judged by it, even when anonymous access is on: a wrong token is a 401,
// never a silent downgrade to the anonymous roles.
func (a *authenticator) authenticate(r *http.Request) (string, Roles, *authError) {
	var certs []*x509.Certificate
	if r.TLS != nil {
		certs = r.TLS.PeerCertificates
	}
	authz := r.Header.Values("Authorization")
	var name string
	switch {
	case len(authz) > 0 && len(certs) > 0:
		return "", Roles{}, unauthenticated("both a client certificate and an Authorization header: present one credential")
	case len(authz) > 1:
		return "", Roles{}, unauthenticated("more than one Authorization header")
	case len(authz) == 1:
		scheme, token, ok := strings.Cut(authz[0], " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			return "", Roles{}, unauthenticated("Authorization header: want \"Bearer <token>\"")
		}
		if a.tokens == nil {
			return "", Roles{}, unauthenticated("bearer tokens are not accepted by this server (auth.tokens_file is not set)")
		}
		p, ok := a.tokens[sha256.Sum256([]byte(token))]
		if !ok {
			return "", Roles{}, unauthenticated("unknown bearer token")
		}
		name = p
	case len(certs) > 0:
		if a.clientCAs == nil {
			return "", Roles{}, unauthenticated("client certificates are not accepted by this server (tls.client_ca is not set)")
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		if _, err := certs[0].Verify(x509.VerifyOptions{Roots: a.clientCAs, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			return "", Roles{}, unauthenticated("client certificate refused: %v", err)
		}
		id, err := pki.NodeID(certs[0])
		if err != nil {
			return "", Roles{}, unauthenticated("client certificate refused: %v", err)
		}
		name = id
	case a.anonymous != nil:
		return AnonymousPrincipal, *a.anonymous, nil
	default:
		return "", Roles{}, unauthenticated("credentials required: a bearer token or a client certificate")
	}
	roles, ok := a.principals[name]
	if !ok {
		return name, Roles{}, forbidden("principal %q has no roles on this server (principals)", name)
	}
	return name, roles, nil
}

// authorize checks roles against what the request needs.
func authorize(name string, roles Roles, c classified) *authError {
	switch c.need {
	case needProduce:
		if !slices.Contains(roles.Produce, AnyProducer) && !slices.Contains(roles.Produce, c.source) {
			return forbidden("principal %q may not produce to source %q", name, c.source)
		}
	case needRead:
		if !roles.Read {
			return forbidden("principal %q lacks the read role (%s)", name, c.pattern)
		}
	case needOperate:
		if !roles.Operate {
			return forbidden("principal %q lacks the operate role (%s)", name, c.pattern)
		}
	case needHold:
		if !roles.Hold {
			return forbidden("principal %q lacks the hold role (%s)", name, c.pattern)
		}
	case needTakedown:
		if !roles.Takedown {
			return forbidden("principal %q lacks the takedown role (%s)", name, c.pattern)
		}
	case needOperateRead:
		switch {
		case !roles.Operate:
			return forbidden("principal %q lacks the operate role (%s)", name, c.pattern)
		case !roles.Read:
			return forbidden("principal %q lacks the read role (%s answers rows' keys and values, which needs read as well as operate)", name, c.pattern)
		}
	}
	return nil
}
