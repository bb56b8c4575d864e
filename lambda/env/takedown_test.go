package env

import (
	"strings"
	"testing"
)

// HOLD_NODES maps IAM users and roles to nodes; an assumed role matches
// by its role whatever the session name (which the caller chooses), and
// anything else is no node.
func TestHoldNodes(t *testing.T) {
	m, err := ParseHoldNodes("arn:aws:iam::123456789012:role/edge-b=edge-b, arn:aws:iam::123456789012:user/edge-a=edge-a")
	if err != nil {
		t.Fatal(err)
	}
	nodeOf := NodeOf(m)
	for caller, want := range map[string]string{
		"arn:aws:iam::123456789012:user/edge-a":                      "edge-a",
		"arn:aws:sts::123456789012:assumed-role/edge-b/device-42":    "edge-b",
		"arn:aws:sts::123456789012:assumed-role/edge-b/edge-a":       "edge-b",
		"arn:aws:sts::210987654321:assumed-role/edge-b/x":            "",
		"arn:aws:sts::123456789012:assumed-role/edge-bb/x":           "",
		"arn:aws:iam::123456789012:user/edge-a/x":                    "",
		"arn:aws:sts::123456789012:federated-user/edge-b":            "",
		"arn:aws:iam::123456789012:role/edge-b":                      "edge-b",
		"arn:aws-cn:sts::123456789012:assumed-role/edge-b/device-42": "",
	} {
		got, ok := nodeOf(caller)
		if got != want || ok != (want != "") {
			t.Errorf("%s: %q %v, want %q", caller, got, ok, want)
		}
	}
	for _, bad := range []string{
		"edge-b",
		"arn:aws:iam::1:role/r=.bad",
		"arn:aws:iam::1:role/r=a,arn:aws:iam::1:role/r=b",
		"arn:aws:iam::1:role/r=a,arn:aws:iam::1:user/u=a",
		"arn:aws:sts::1:assumed-role/r/s=a",
	} {
		if _, err := ParseHoldNodes(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The takedown variables are checked with the others.
func TestTakedownVars(t *testing.T) {
	vars := map[string]string{}
	for k, v := range valid() {
		vars[k] = v
	}
	vars[VarTakedownCA] = "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"
	vars[VarTakedownOverdue] = "10s"
	vars[VarHoldNodes] = "nope"
	vars[VarTakedownCloseAfter] = "1m"
	_, err := Parse(getenv(vars))
	for _, want := range []string{VarTakedownCA, VarTakedownOverdue, VarHoldNodes, VarTakedownCloseAfter} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s not refused: %v", want, err)
		}
	}
}
