package relayapi

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/relayapi/relayapitest"
	"github.com/relay-dev/relay/edge/takedown"
)

// eventually polls cond; it bounds a wait, it does not pace the test.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within 30s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRunThroughOutage: Run's three jobs with the relay down from the
// start: they back off, and once it is up the holdings are reported, the
// order applied and its receipt accepted, with no contract violation.
func TestRunThroughOutage(t *testing.T) {
	f := newFixture(t, "edge-a", nil)
	sha := f.put("seg-1", []byte("one"))
	f.put("seg-2", []byte("two"))
	o := f.srv.AddOrder("edge-a", "seg-1", sha, "td-1", "r")
	f.srv.Down()
	f.run()
	eventually(t, "each job failing", func() bool {
		st := f.agent.Status()
		return st.Holdings.Failures > 1 && st.Orders.Failures > 1 && st.Holdings.NextAttempt != nil
	})
	f.srv.Up()
	eventually(t, "receipt accepted", func() bool { _, ok := f.srv.Receipts()[o.Request]; return ok })
	eventually(t, "holdings: seg-1 evicted, seg-2 held", func() bool {
		h := f.srv.Holdings("edge-a")
		return h["seg-1"].State == takedown.StateEvicted && h["seg-2"].State == takedown.StateHeld
	})
	eventually(t, "status clean", func() bool {
		st := f.agent.Status()
		return st.Holdings.Failures == 0 && st.Orders.Failures == 0 && st.Receipts.Failures == 0 && st.Holdings.LastSuccess != nil
	})
}

// TestSigV4: towards a function URL the node signs every request with
// SigV4 (service lambda, the region configured, credentials from the
// default chain: here the environment) and presents no certificate; the
// server recomputes each signature. Credentials the server does not know
// are refused (401) and not taken for a network failure.
func TestSigV4(t *testing.T) {
	clearAWSEnv(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDEDGEA")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret-a")
	creds := aws.Credentials{AccessKeyID: "AKIDEDGEA", SecretAccessKey: "secret-a"}
	f := newFixture(t, "edge-a", nil)
	srv := relayapitest.New(t, relayapitest.Options{PKIDir: f.pkiDir, SigV4: &creds, Region: "eu-west-1", SigV4Node: "edge-a"})
	cfg := f.cfg
	cfg.URL, cfg.CA, cfg.Auth, cfg.Region = srv.URL(), srv.CAFile(), config.AuthSigV4, "eu-west-1"
	hc, err := NewHTTPClient(cfg, func() *tls.Certificate { t.Error("a certificate asked for with sigv4"); return &f.cert })
	if err != nil {
		t.Fatal(err)
	}
	signer, source, err := NewSigV4(cfg.Region)
	if err != nil || source != "environment" {
		t.Fatal(source, err)
	}
	sha := f.put("seg-1", []byte("one"))
	a, err := New(Options{Node: "edge-a", Config: cfg, HTTP: hc, Sign: signer, DB: f.db, Store: f.store, Evict: f.evict,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	o := srv.AddOrder("edge-a", "seg-1", sha, "td", "r")
	f.pass(func(ctx context.Context) error { return a.reportPass(ctx, false) })
	f.pass(a.orderPass)
	f.pass(a.receiptPass)
	f.pass(func(ctx context.Context) error { return a.reportPass(ctx, false) })
	if _, ok := srv.Receipts()[o.Request]; !ok {
		t.Fatalf("receipt not accepted: %+v", a.Status())
	}
	if h := srv.Holdings("edge-a")["seg-1"]; h.State != takedown.StateEvicted {
		t.Fatalf("holding %+v", h)
	}

	t.Setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
	signer, _, err = NewSigV4(cfg.Region)
	if err != nil {
		t.Fatal(err)
	}
	a.api.sign = signer
	f.put("seg-2", []byte("two"))
	err = a.reportPass(context.Background(), false)
	if err == nil || retryable(err) || !strings.Contains(err.Error(), "401") {
		t.Fatalf("wrong secret: %v, want a 401 refusal", err)
	}
}

// TestIdlePassIsNoSuccess: with the relay down, a receipts pass with
// nothing to post asks the relay nothing; it must not count as the job's
// success, or time() - edged_relayapi_last_success_timestamp_seconds
// {job="receipts"} (and edgectl status's last success) kept advancing
// through an outage. Only a pass the relay answered is a success: once
// it is up and accepts a receipt, and not again while it is down and
// there is nothing to post. The orders job asks every pass: it has no
// success while the relay is down.
func TestIdlePassIsNoSuccess(t *testing.T) {
	f := newFixture(t, "edge-a", nil)
	sha := f.put("seg-1", []byte("one"))
	f.srv.Down()
	f.run()
	gauge := func(job string) float64 { return testutil.ToFloat64(f.agent.met.lastSuccess.WithLabelValues(job)) }
	eventually(t, "idle receipts passes, orders failing", func() bool {
		return f.agent.receipts.passesEnded() >= 3 && f.agent.Status().Orders.Failures > 1
	})
	if st := f.agent.Status(); st.Receipts.LastSuccess != nil || st.Orders.LastSuccess != nil {
		t.Fatalf("relay down from the start, yet last success: receipts %v, orders %v", st.Receipts.LastSuccess, st.Orders.LastSuccess)
	}
	if g := gauge(jobReceipts); g != 0 {
		t.Fatalf("receipts last success gauge %v with the relay down from the start, want none", g)
	}

	f.srv.Up()
	o := f.srv.AddOrder("edge-a", "seg-1", sha, "td-1", "r")
	eventually(t, "receipt accepted", func() bool { _, ok := f.srv.Receipts()[o.Request]; return ok })
	eventually(t, "receipts success recorded", func() bool { return f.agent.Status().Receipts.LastSuccess != nil })
	posted := *f.agent.Status().Receipts.LastSuccess
	postedGauge := gauge(jobReceipts)
	if postedGauge == 0 {
		t.Fatal("no receipts last success gauge after an accepted receipt")
	}

	f.srv.Down()
	n := f.agent.receipts.passesEnded()
	eventually(t, "more idle receipts passes with the relay down", func() bool {
		return f.agent.receipts.passesEnded() >= n+3 && f.agent.Status().Orders.Failures > 1
	})
	if st := f.agent.Status(); !st.Receipts.LastSuccess.Equal(posted) {
		t.Fatalf("receipts last success moved from %v to %v while the relay was down", posted, st.Receipts.LastSuccess)
	}
	if g := gauge(jobReceipts); g != postedGauge {
		t.Fatalf("receipts last success gauge moved from %v to %v while the relay was down", postedGauge, g)
	}
}
