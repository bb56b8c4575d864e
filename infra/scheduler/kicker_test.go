package scheduler_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awsscheduler "github.com/aws/aws-sdk-go-v2/service/scheduler"

	"github.com/relay-dev/relay/infra/scheduler"
	"github.com/relay-dev/relay/relaycore"
)

// kicker is the alarm-kick signature relaycore consumes (relaycore.Kicker
// once the engine lands); the assertion keeps the adapter in step with it.
type kicker interface {
	Kick(ctx context.Context, source relaycore.Partition, dueMS int64) error
}

var _ kicker = (*scheduler.Kicker)(nil)

const (
	testGroup  = "relay-alarms"
	testTarget = "arn:aws:lambda:eu-west-1:123456789012:function:relay-fire"
	testRole   = "arn:aws:iam::123456789012:role/relay-scheduler"
)

// createRequest is CreateSchedule's JSON body as Scheduler receives it.
type createRequest struct {
	Name                       string `json:"-"`
	ActionAfterCompletion      string
	ClientToken                string
	FlexibleTimeWindow         struct{ Mode string }
	GroupName                  string
	ScheduleExpression         string
	ScheduleExpressionTimezone string
	Target                     struct{ Arn, RoleArn, Input string }
}

// fakeScheduler records CreateSchedule requests and answers like Scheduler:
// 200 for a new name, 409 ConflictException for an existing one, or the
// status forced by fail.
type fakeScheduler struct {
	t    *testing.T
	mu   sync.Mutex
	reqs []createRequest
	seen map[string]bool
	fail int // HTTP status to answer every request with; 0 = behave
	srv  *httptest.Server
}

func (f *fakeScheduler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutPrefix(r.URL.Path, "/schedules/")
	if r.Method != http.MethodPost || !ok {
		f.t.Errorf("unexpected request %s %s", r.Method, r.URL.Path)
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 ") {
		f.t.Errorf("request not signed: %q", r.Header.Get("Authorization"))
	}
	name, err := url.PathUnescape(name)
	if err != nil {
		f.t.Errorf("bad path %q: %v", r.URL.Path, err)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		f.t.Errorf("read body: %v", err)
	}
	var req createRequest
	if err := json.Unmarshal(body, &req); err != nil {
		f.t.Errorf("decode body %s: %v", body, err)
	}
	req.Name = name
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	dup := f.seen[name]
	f.seen[name] = true
	fail := f.fail
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case fail != 0:
		w.Header().Set("X-Amzn-ErrorType", "InternalServerException")
		w.WriteHeader(fail)
		io.WriteString(w, `{"Message":"injected failure"}`)
	case dup:
		w.Header().Set("X-Amzn-ErrorType", "ConflictException")
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"Message":"Schedule `+name+` already exists."}`)
	default:
		io.WriteString(w, `{"ScheduleArn":"arn:aws:scheduler:eu-west-1:123456789012:schedule/`+testGroup+`/`+name+`"}`)
	}
}

func (f *fakeScheduler) requests() []createRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]createRequest(nil), f.reqs...)
}

// newKicker starts a recording Scheduler endpoint and returns a Kicker that
// reaches it through the real SDK client (signing, serialization, error
// deserialization), with a fixed clock.
func newKicker(t *testing.T, now time.Time) (*scheduler.Kicker, *fakeScheduler) {
	t.Helper()
	fake := &fakeScheduler{t: t, seen: map[string]bool{}}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	fake.srv = srv
	return fake.kicker(t, now), fake
}

// kicker is another Kicker (another process's) reaching the same endpoint,
// with a fixed clock.
func (f *fakeScheduler) kicker(t *testing.T, now time.Time) *scheduler.Kicker {
	t.Helper()
	return f.kickerWithClock(t, func() time.Time { return now })
}

func (f *fakeScheduler) kickerWithClock(t *testing.T, now func() time.Time) *scheduler.Kicker {
	t.Helper()
	client := awsscheduler.New(awsscheduler.Options{
		Region:       "eu-west-1",
		BaseEndpoint: aws.String(f.srv.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		// One attempt: the 500 test must see the failure, not a retry
		// with back-off.
		RetryMaxAttempts: 1,
		HTTPClient:       f.srv.Client(),
	})
	k, err := scheduler.New(scheduler.Config{
		Client:    client,
		Group:     testGroup,
		TargetARN: testTarget,
		RoleARN:   testRole,
		Now:       now,
		MinLead:   5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var testNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestKickRequestShape(t *testing.T) {
	k, fake := newKicker(t, testNow)
	source := relaycore.Partition(`tenant/42 "quoted"`)
	due := testNow.Add(90*time.Second + 250*time.Millisecond)
	if err := k.Kick(context.Background(), source, due.UnixMilli()); err != nil {
		t.Fatalf("kick: %v", err)
	}
	reqs := fake.requests()
	if len(reqs) != 1 {
		t.Fatalf("got %d requests, want 1", len(reqs))
	}
	r := reqs[0]
	// The due is rounded up to the next second: a fire before the due
	// time would find nothing due.
	wantSec := due.Unix() + 1
	checks := []struct{ field, got, want string }{
		{"Name", r.Name, scheduler.ScheduleName(source, wantSec)},
		{"GroupName", r.GroupName, testGroup},
		{"ScheduleExpression", r.ScheduleExpression, "at(2026-11-29T12:01:31)"},
		{"ScheduleExpressionTimezone", r.ScheduleExpressionTimezone, "UTC"},
		{"ActionAfterCompletion", r.ActionAfterCompletion, "DELETE"},
		{"FlexibleTimeWindow.Mode", r.FlexibleTimeWindow.Mode, "OFF"},
		{"Target.Arn", r.Target.Arn, testTarget},
		{"Target.RoleArn", r.Target.RoleArn, testRole},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.field, c.got, c.want)
		}
	}
	if r.ClientToken == "" {
		t.Error("ClientToken empty: SDK retries would not be idempotent")
	}
	var in scheduler.FireInput
	if err := json.Unmarshal([]byte(r.Target.Input), &in); err != nil {
		t.Fatalf("target input %q is not JSON: %v", r.Target.Input, err)
	}
	if in.Source != string(source) {
		t.Errorf("target input source = %q, want %q", in.Source, source)
	}
	if got := k.Stats(); got != (scheduler.Stats{Calls: 1, Armed: 1}) {
		t.Errorf("stats = %+v", got)
	}
}

// TestKickDuplicateIsAlreadyArmed: kicks from other processes (Kickers
// that did not create the schedule) for the same due second name the same
// schedule and are answered ConflictException: armed already.
func TestKickDuplicateIsAlreadyArmed(t *testing.T) {
	k, fake := newKicker(t, testNow)
	due := testNow.Add(time.Minute).UnixMilli()
	ctx := context.Background()
	if err := k.Kick(ctx, "s1", due); err != nil {
		t.Fatal(err)
	}
	others := make([]*scheduler.Kicker, 3)
	for i := range others {
		others[i] = fake.kicker(t, testNow)
		// A due in the same second names the same schedule.
		if err := others[i].Kick(ctx, "s1", due-int64(i)); err != nil {
			t.Fatalf("kick %d: %v", i, err)
		}
	}
	reqs := fake.requests()
	for _, r := range reqs[1:] {
		if r.Name != reqs[0].Name {
			t.Errorf("name %q differs from first kick's %q", r.Name, reqs[0].Name)
		}
	}
	if got, want := k.Stats(), (scheduler.Stats{Calls: 1, Armed: 1}); got != want {
		t.Errorf("stats = %+v, want %+v", got, want)
	}
	for i, o := range others {
		if got, want := o.Stats(), (scheduler.Stats{Calls: 1, Conflicts: 1}); got != want {
			t.Errorf("kicker %d: stats = %+v, want %+v", i, got, want)
		}
	}
}

// TestKickCoveredByItsPendingSchedule: a kick for a due time at or before
// the at() of the schedule the Kicker created last for the source, while
// that time is still ahead, sends nothing (the schedule is that wake-up);
// a later due, another source, or the schedule's time passing sends again.
// A failed or conflicting create records nothing.
func TestKickCoveredByItsPendingSchedule(t *testing.T) {
	now := testNow
	_, fake := newKicker(t, testNow)
	k := fake.kickerWithClock(t, func() time.Time { return now })
	ctx := context.Background()
	kick := func(src relaycore.Partition, due time.Time) {
		t.Helper()
		if err := k.Kick(ctx, src, due.UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	kick("s1", testNow)                    // at(now+5s): created
	kick("s1", testNow.Add(time.Second))   // due before it: covered
	kick("s1", testNow.Add(5*time.Second)) // due at it: covered
	kick("s2", testNow)                    // another source: created
	kick("s1", testNow.Add(6*time.Second)) // due after it: created, at(now+6s)
	now = testNow.Add(6 * time.Second)     // the schedule's time has come
	kick("s1", testNow.Add(7*time.Second)) // it may have run: created (at now+11s)
	if got, want := k.Stats(), (scheduler.Stats{Calls: 4, Armed: 4, Covered: 2}); got != want {
		t.Errorf("stats = %+v, want %+v", got, want)
	}
	var exprs []string
	for _, r := range fake.requests() {
		exprs = append(exprs, r.ScheduleExpression)
	}
	if want := []string{"at(2026-11-29T12:00:05)", "at(2026-11-29T12:00:05)", "at(2026-11-29T12:00:06)", "at(2026-11-29T12:00:11)"}; !slices.Equal(exprs, want) {
		t.Errorf("schedules %v, want %v", exprs, want)
	}

	// Failures and conflicts are not knowledge of a pending schedule.
	fake.fail = http.StatusInternalServerError
	f := fake.kicker(t, testNow)
	if err := f.Kick(ctx, "s3", testNow.UnixMilli()); err == nil {
		t.Fatal("kick against a failing endpoint returned nil")
	}
	fake.fail = 0
	// Due before the failed kick's at(): covered, had the failure been
	// taken for a schedule.
	if err := f.Kick(ctx, "s3", testNow.Add(time.Second).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	c := fake.kicker(t, testNow)
	for range 2 {
		if err := c.Kick(ctx, "s3", testNow.UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := f.Stats(), (scheduler.Stats{Calls: 2, Armed: 1, Failures: 1}); got != want {
		t.Errorf("after a failure: stats = %+v, want %+v", got, want)
	}
	if got, want := c.Stats(), (scheduler.Stats{Calls: 2, Conflicts: 2}); got != want {
		t.Errorf("after a conflict: stats = %+v, want %+v", got, want)
	}
}

func TestKickServerErrorIsReturnedAndCounted(t *testing.T) {
	k, fake := newKicker(t, testNow)
	fake.fail = http.StatusInternalServerError
	err := k.Kick(context.Background(), "s1", testNow.Add(time.Minute).UnixMilli())
	if err == nil {
		t.Fatal("kick against a failing endpoint returned nil")
	}
	if !strings.Contains(err.Error(), "create schedule") || !strings.Contains(err.Error(), "InternalServerException") {
		t.Errorf("error %q does not name the operation and the cause", err)
	}
	if got, want := k.Stats(), (scheduler.Stats{Calls: 1, Failures: 1}); got != want {
		t.Errorf("stats = %+v, want %+v", got, want)
	}
}

func TestKickPastDueSchedulesAtMinLead(t *testing.T) {
	k, fake := newKicker(t, testNow)
	ctx := context.Background()
	past := testNow.Add(-10 * time.Minute).UnixMilli()
	soon := testNow.Add(2 * time.Second).UnixMilli() // inside MinLead
	for i, due := range []int64{past, soon, 0} {
		if i > 0 {
			// Another process's kicker: k's own would find its first
			// schedule covering these dues (TestKickCoveredByItsPendingSchedule).
			k = fake.kicker(t, testNow)
		}
		if err := k.Kick(ctx, "s1", due); err != nil {
			t.Fatalf("kick due %d: %v", due, err)
		}
	}
	reqs := fake.requests()
	if len(reqs) != 3 {
		t.Fatalf("got %d requests, want 3", len(reqs))
	}
	for i, due := range []int64{past, soon, 0} {
		if got, want := reqs[i].ScheduleExpression, "at(2026-11-29T12:00:05)"; got != want {
			t.Errorf("due %d: expression %q, want %q", due, got, want)
		}
		// The name keeps the original due so repeated kicks of one overdue
		// alarm collapse, whatever the clock says.
		if got, want := reqs[i].Name, scheduler.ScheduleName("s1", (due+999)/1000); got != want {
			t.Errorf("due %d: name %q, want %q", due, got, want)
		}
	}
}

func TestKickEmptySource(t *testing.T) {
	k, fake := newKicker(t, testNow)
	err := k.Kick(context.Background(), "", testNow.UnixMilli())
	if !errors.Is(err, scheduler.ErrInvalidSource) {
		t.Fatalf("err = %v, want ErrInvalidSource", err)
	}
	if n := len(fake.requests()); n != 0 {
		t.Errorf("%d requests sent for an empty source", n)
	}
}

func TestNewRejectsIncompleteConfig(t *testing.T) {
	full := scheduler.Config{Client: awsscheduler.New(awsscheduler.Options{}), Group: "g", TargetARN: "t", RoleARN: "r"}
	cases := map[string]func(*scheduler.Config){
		"client": func(c *scheduler.Config) { c.Client = nil },
		"group":  func(c *scheduler.Config) { c.Group = "" },
		"target": func(c *scheduler.Config) { c.TargetARN = "" },
		"role":   func(c *scheduler.Config) { c.RoleARN = "" },
		"lead":   func(c *scheduler.Config) { c.MinLead = -time.Second },
	}
	for name, breakIt := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := full
			breakIt(&cfg)
			if _, err := scheduler.New(cfg); err == nil {
				t.Error("New accepted an incomplete config")
			}
		})
	}
	if _, err := scheduler.New(full); err != nil {
		t.Errorf("New rejected a complete config: %v", err)
	}
}

// TestKickConcurrentSameAlarm: eight kicks at once for one alarm arm one
// schedule; each other kick is either a conflict (it reached Scheduler
// before the first one's create returned) or covered by that schedule
// (after), in proportions the goroutines' timing decides.
func TestKickConcurrentSameAlarm(t *testing.T) {
	k, fake := newKicker(t, testNow)
	due := testNow.Add(time.Minute).UnixMilli()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := k.Kick(context.Background(), "hot", due); err != nil {
				t.Errorf("kick: %v", err)
			}
		})
	}
	wg.Wait()
	got := k.Stats()
	if got.Armed != 1 || got.Failures != 0 || got.Conflicts+got.Covered != 7 || got.Calls != got.Armed+got.Conflicts {
		t.Errorf("stats = %+v, want 1 armed and 7 conflicts or covered kicks, every call armed or a conflict", got)
	}
	if n := int64(len(fake.requests())); n != got.Calls {
		t.Errorf("%d requests, want %d (one per call)", n, got.Calls)
	}
}
