package relaycli

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/infra/dynamo"
	"github.com/relay-dev/relay/infra/dynamotest"
	"github.com/relay-dev/relay/lambda/api"
	"github.com/relay-dev/relay/relaycore"
)

// cli runs the relay command; want is the exit code.
func cli(t *testing.T, want int, stdin string, args ...string) (string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := RunWithInput(t.Context(), args, strings.NewReader(stdin), &out, &errb)
	if code != want {
		t.Fatalf("relay %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, want, out.String(), errb.String())
	}
	return out.String(), errb.String()
}

func rowsBody(rows ...[3]string) string {
	var rs []string
	for _, r := range rows {
		rs = append(rs, fmt.Sprintf(`{"target":%q,"puts":[{"key":%q,"value":%q}]}`, r[0], r[1], base64.StdEncoding.EncodeToString([]byte(r[2]))))
	}
	return `{"rows":[` + strings.Join(rs, ",") + `]}`
}

func boltValue(t *testing.T, db, target, key string) string {
	t.Helper()
	b, err := bolt.Open(db, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	v, ok, err := b.Store("target").Get(t.Context(), relaycore.Partition(target), key)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return "<absent>"
	}
	return string(v)
}

// TestOperatorCommandsOnBolt: the runbook's commands on an embedded
// relay's bbolt file: quarantine, fire (rows held), list and show, a stale
// skip refused, skip, release, fire (the rest delivered in order), archive
// list, export and requeue.
func TestOperatorCommandsOnBolt(t *testing.T) {
	db := filepath.Join(t.TempDir(), "relay.db")
	cli(t, 0, rowsBody([3]string{"t1", "k", "poison"}, [3]string{"t1", "k", "v2"}, [3]string{"t2", "k", "ok"}),
		"enqueue", "--db", db, "--source", "orders")
	out, _ := cli(t, 0, "", "target", "quarantine", "--db", db, "--source", "orders", "t1", "--reason", "refuses order 1", "--by", "alice")
	if !strings.Contains(out, "quarantine: t1 quarantined") || !strings.Contains(out, "quarantine by alice") {
		t.Errorf("quarantine output:\n%s", out)
	}
	cli(t, 0, "", "fire", "--db", db, "orders")
	if v := boltValue(t, db, "t2", "k"); v != "ok" {
		t.Fatalf("healthy target: %q", v)
	}

	out, _ = cli(t, 0, "", "targets", "list", "--db", db, "--source", "orders", "--json", "--state", "quarantined")
	var list api.TargetsResponse
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Targets) != 1 || list.Targets[0].HeldFirst != 1 || list.Targets[0].HeldLast != 2 {
		t.Fatalf("targets list --json: %v\n%s", err, out)
	}
	out, _ = cli(t, 0, "", "targets", "list", "--db", db, "--source", "orders", "--all")
	if !strings.Contains(out, "TARGET") || !strings.Contains(out, "quarantined") || !strings.Contains(out, "t2") {
		t.Errorf("targets list:\n%s", out)
	}
	out, _ = cli(t, 0, "", "targets", "show", "--db", db, "--source", "orders", "t1")
	if !strings.Contains(out, "2 rows, seqs 1..2") {
		t.Errorf("targets show:\n%s", out)
	}

	out, errOut := cli(t, 1, "", "target", "skip", "--db", db, "--source", "orders", "t1", "--expect-first", "2", "--through", "2", "--reason", "poison")
	if !strings.Contains(errOut, "skip_conflict") || !strings.Contains(errOut, "first undelivered held seq: 1") || out != "" {
		t.Errorf("stale skip: stdout %q, stderr %s", out, errOut)
	}
	// With --json a script reads the actual first held seq from stdout.
	out, errOut = cli(t, 1, "", "target", "skip", "--db", db, "--source", "orders", "t1", "--expect-first", "2", "--through", "2", "--reason", "poison", "--json")
	if e := jsonError(t, out); e.Code != "skip_conflict" || e.Status != 409 || e.ActualFirst == nil || *e.ActualFirst != 1 ||
		!strings.Contains(errOut, "skip_conflict") || e.Message+"\n" != strings.TrimPrefix(errOut, "relay: ") {
		t.Errorf("stale skip --json: %+v\nstderr: %s", e, errOut)
	}
	out, _ = cli(t, 0, "", "target", "skip", "--db", db, "--source", "orders", "t1", "--expect-first", "1", "--through", "1", "--reason", "poison", "--by", "alice")
	if !strings.Contains(out, "skipped 1 rows (seqs 1..1) of t1 into archive entry 1") {
		t.Errorf("skip output:\n%s", out)
	}
	cli(t, 0, "", "target", "release", "--db", db, "--source", "orders", "t1")
	cli(t, 0, "", "fire", "--db", db, "orders")
	if v := boltValue(t, db, "t1", "k"); v != "v2" {
		t.Fatalf("after release t1 k = %q, want v2 (the skipped row never applied)", v)
	}

	out, _ = cli(t, 0, "", "archive", "list", "--db", db, "--source", "orders")
	if !strings.Contains(out, "alice") || !strings.Contains(out, "poison") || !strings.Contains(out, "1..1") {
		t.Errorf("archive list:\n%s", out)
	}
	out, _ = cli(t, 0, "", "archive", "export", "--db", db, "--source", "orders")
	var ex api.ArchiveExportResponse
	if err := json.Unmarshal([]byte(out), &ex); err != nil || len(ex.Entries) != 1 || len(ex.Entries[0].Data) != 1 || *ex.Entries[0].Data[0].Puts[0].Value != base64.StdEncoding.EncodeToString([]byte("poison")) {
		t.Fatalf("archive export: %v\n%s", err, out)
	}
	out, _ = cli(t, 0, "", "archive", "requeue", "--db", db, "--source", "orders", "1", "--json")
	var rq api.RequeueResponse
	if err := json.Unmarshal([]byte(out), &rq); err != nil || !slices.Equal(rq.Seqs, []uint64{4}) {
		t.Fatalf("requeue: %v\n%s", err, out)
	}
	cli(t, 0, "", "fire", "--db", db, "orders")
	if v := boltValue(t, db, "t1", "k"); v != "poison" {
		t.Errorf("requeued row: t1 k = %q", v)
	}
}

// TestOperatorCommandRefusals: bad input exits 1 with the API's message and
// changes nothing.
func TestOperatorCommandRefusals(t *testing.T) {
	db := filepath.Join(t.TempDir(), "relay.db")
	cli(t, 0, rowsBody([3]string{"t1", "k", "v"}), "enqueue", "--db", db, "--source", "orders")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"target", "pause", "--db", db, "--source", "orders", "nobody"}, "unknown_target"},
		{[]string{"target", "release", "--db", db, "--source", "orders", "t1"}, "wrong_state"},
		{[]string{"target", "pause", "--db", db, "--source", "orders", "t1", "--reason", strings.Repeat("r", 300)}, "reason is 300 bytes"},
		{[]string{"target", "skip", "--db", db, "--source", "orders", "t1", "--expect-first", "1", "--through", "1"}, "reason is required"},
		{[]string{"targets", "list", "--db", db, "--source", "orders", "--state", "stuck"}, "bad_request"},
		{[]string{"archive", "requeue", "--db", db, "--source", "orders", "9"}, "unknown_archive_entry"},
		{[]string{"targets", "list", "--db", db}, "--source is required"},
		{[]string{"targets", "list", "--source", "orders"}, "--db is required"},
		{[]string{"targets", "list", "--db", db + ".missing", "--source", "orders"}, "--db"},
		{[]string{"targets", "list", "--store", "sql", "--source", "orders"}, "--store"},
	} {
		t.Run(strings.Join(tc.args[:2], " ")+" "+tc.want, func(t *testing.T) {
			before := dumpBolt(t, db)
			_, errOut := cli(t, 1, "", tc.args...)
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr %q, want %q", errOut, tc.want)
			}
			if after := dumpBolt(t, db); after != before {
				t.Error("a refused command changed the file")
			}
		})
	}
}

// dumpBolt renders the file's source and target partitions.
func dumpBolt(t *testing.T, path string) string {
	t.Helper()
	b, err := bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var sb strings.Builder
	for _, name := range []string{"source", "target"} {
		st := b.Store(name)
		for _, p := range []relaycore.Partition{"orders", "t1"} {
			pg, err := st.Scan(t.Context(), p, relaycore.ScanRequest{Limit: 1000})
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range pg.Items {
				fmt.Fprintf(&sb, "%s/%s/%s=%x\n", name, p, it.Key, it.Value)
			}
		}
	}
	return sb.String()
}

// TestOperatorCommandsOnDynamo: the same commands against DynamoDB tables
// (real SDK over HTTP to the in-process endpoint), as an operator runs
// them against a deployed stack's tables with --table-prefix.
func TestOperatorCommandsOnDynamo(t *testing.T) {
	ep := dynamotest.Start(t)
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "relay")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "relay")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	client := ep.Client(nil)
	for _, tbl := range []string{"prod-source", "prod-target"} {
		if err := dynamo.CreateTable(t.Context(), client, tbl); err != nil {
			t.Fatal(err)
		}
	}
	src, dst := dynamo.New(client, "prod-source", dynamo.Options{}), dynamo.New(client, "prod-target", dynamo.Options{})
	if _, err := (&relaycore.RelayHandler{Source: src, Clock: relaycore.SystemClock{}}).Enqueue(t.Context(), "orders", []relaycore.Row{{Target: "t1", Puts: []relaycore.KV{{Key: "k", Value: []byte("v1")}}}}, relaycore.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--store", "dynamo", "--endpoint", ep.URL, "--table-prefix", "prod-", "--source", "orders"}
	out, _ := cli(t, 0, "", append([]string{"target", "pause", "t1", "--reason", "maintenance", "--json"}, flags...)...)
	var tr api.TargetResponse
	if err := json.Unmarshal([]byte(out), &tr); err != nil || tr.Status.State != relaycore.StatePaused || tr.Status.Note.By == "" {
		t.Fatalf("pause on dynamo: %v\n%s", err, out)
	}
	h := &relaycore.RelayHandler{Source: src, Target: dst, Budget: relaycore.RelayBudget{}}
	if b, err := relaycore.PlanBudget("free"); err == nil {
		h.Budget = b
	}
	if _, err := h.Alarm(t.Context(), "orders"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := dst.Get(t.Context(), "t1", "k"); ok {
		t.Fatal("a paused target received its row")
	}
	out, _ = cli(t, 0, "", append([]string{"targets", "show", "t1"}, flags...)...)
	if !strings.Contains(out, "paused since") || !strings.Contains(out, "1 rows, seqs 1..1") {
		t.Errorf("targets show on dynamo:\n%s", out)
	}
	cli(t, 0, "", append([]string{"target", "resume", "t1"}, flags...)...)
	if _, err := h.Alarm(t.Context(), "orders"); err != nil {
		t.Fatal(err)
	}
	if v, ok, _ := dst.Get(t.Context(), "t1", "k"); !ok || string(v) != "v1" {
		t.Errorf("after resume t1 k = %q", v)
	}
	_, errOut := cli(t, 1, "", "targets", "list", "--store", "dynamo", "--endpoint", ep.URL, "--table-prefix", "staging-", "--source", "orders")
	if !strings.Contains(errOut, "staging-source") {
		t.Errorf("missing tables: %s", errOut)
	}
}

// Arguments the command can tell are wrong are refused as usage (exit 1,
// code usage) before anything is opened or sent: the --db named here does
// not exist, so any command that got as far as the store would fail
// otherwise.
func TestBadArgumentsAreUsage(t *testing.T) {
	db := filepath.Join(t.TempDir(), "none.db")
	for _, args := range [][]string{
		{"target", "skip", "--source", "orders", "t1", "--through", "3", "--reason", "x", "--db", db},
		{"target", "skip", "--source", "orders", "t1", "--expect-first", "3", "--through", "3", "--db", db},
		{"archive", "requeue", "--source", "orders", "abc", "--db", db},
		{"archive", "requeue", "--source", "orders", "0", "--db", db},
		{"target", "pause", "--source", "orders", "", "--db", db},
		{"targets", "show", "--source", "orders", "_relay/x", "--db", db},
		{"targets", "list", "--source", "orders", "--bogus", "--db", db},
		{"serve", "token", "--principal", "bad name"},
		{"demo", "--plan", "bogus"},
	} {
		out, _ := cli(t, 1, "", append(args, "--json")...)
		if e := jsonError(t, out); e.Code != codeUsage {
			t.Errorf("relay %s: %+v, want code usage", strings.Join(args, " "), e)
		}
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Errorf("a refused command created %s: %v", db, err)
	}
}
