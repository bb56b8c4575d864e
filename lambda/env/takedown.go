package env

import (
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	"github.com/relay-dev/relay/relaycore/takedowns"
)

// The takedown owner's variables (docs/takedown.md, Lambda).
const (
	// VarTakedownCA is the PEM text of the CA certificates node receipts
	// must chain to (template.yaml's TakedownCA parameter). Empty: receipts
	// are refused (500 not_configured); the rest of the owner works.
	VarTakedownCA = "TAKEDOWN_CA"
	// VarTakedownOverdue is how long after its request a holder's order is
	// overdue (a Go duration, 1m..8760h; default 24h).
	VarTakedownOverdue = "TAKEDOWN_OVERDUE"
	// VarTakedownCloseAfter is how long a complete takedown stays watched
	// after its last receipt or waiver (takedowns.Owner.CloseAfter; a Go
	// duration, 1h..87600h; default 720h).
	VarTakedownCloseAfter = "TAKEDOWN_CLOSE_AFTER"
	// VarHoldNodes maps IAM callers of the producer function URL to the
	// node ids they are, for the hold routes: comma-separated
	// <principal>=<node>, where principal is an IAM user ARN or a role ARN
	// (arn:aws:iam::<account>:role/<name>), which matches every session of
	// that role. A caller not listed is refused the hold routes (403).
	VarHoldNodes = "HOLD_NODES"
)

// parseTakedowns reads the takedown variables into c.
func parseTakedowns(get func(string) string, bad func(string, ...any), c *Config) {
	c.TakedownOverdue = takedowns.DefaultOverdue
	if v := get(VarTakedownOverdue); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Minute || d > 365*24*time.Hour {
			bad("%s=%q: want a duration 1m..8760h", VarTakedownOverdue, v)
		} else {
			c.TakedownOverdue = d
		}
	}
	c.TakedownCloseAfter = takedowns.DefaultCloseAfter
	if v := get(VarTakedownCloseAfter); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Hour || d > 10*365*24*time.Hour {
			bad("%s=%q: want a duration 1h..87600h", VarTakedownCloseAfter, v)
		} else {
			c.TakedownCloseAfter = d
		}
	}
	if v := get(VarTakedownCA); v != "" {
		p := x509.NewCertPool()
		if !p.AppendCertsFromPEM([]byte(v)) {
			bad("%s: no PEM certificate in it", VarTakedownCA)
		} else {
			c.TakedownRoots = p
		}
	}
	if v := get(VarHoldNodes); v != "" {
		m, err := ParseHoldNodes(v)
		if err != nil {
			bad("%s: %v", VarHoldNodes, err)
		} else {
			c.HoldNodes = m
		}
	}
}

// ParseHoldNodes reads HOLD_NODES: <principal>=<node>, comma-separated.
// Principals are IAM user or role ARNs; a node may be named once.
func ParseHoldNodes(s string) (map[string]string, error) {
	m := map[string]string{}
	nodes := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		p, node, ok := strings.Cut(item, "=")
		p, node = strings.TrimSpace(p), strings.TrimSpace(node)
		if !ok || !strings.HasPrefix(p, "arn:") || !(strings.Contains(p, ":user/") || strings.Contains(p, ":role/")) {
			return nil, fmt.Errorf("%q: want <IAM user or role ARN>=<node id>", item)
		}
		if err := takedowns.CheckNode(node); err != nil {
			return nil, fmt.Errorf("%q: %v", item, err)
		}
		if _, dup := m[p]; dup {
			return nil, fmt.Errorf("principal %s listed twice", p)
		}
		if nodes[node] {
			return nil, fmt.Errorf("node %s mapped twice: a node is one principal", node)
		}
		m[p], nodes[node] = node, true
	}
	return m, nil
}

// NodeOf is api.Handler.NodeOf for a HOLD_NODES mapping: the caller's ARN
// (the function URL's verified IAM caller), an IAM user's as is, an
// assumed role's as its role ARN (the session name is the caller's
// choice, so it names no one).
func NodeOf(m map[string]string) func(string) (string, bool) {
	return func(caller string) (string, bool) {
		if n, ok := m[caller]; ok {
			return n, true
		}
		// arn:<partition>:sts::<account>:assumed-role/<role>/<session>
		parts := strings.SplitN(caller, ":", 6)
		if len(parts) == 6 && parts[2] == "sts" {
			if rest, ok := strings.CutPrefix(parts[5], "assumed-role/"); ok {
				if role, _, ok := strings.Cut(rest, "/"); ok {
					n, ok := m[fmt.Sprintf("arn:%s:iam::%s:role/%s", parts[1], parts[4], role)]
					return n, ok
				}
			}
		}
		return "", false
	}
}
