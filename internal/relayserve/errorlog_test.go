package relayserve

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Failed handshakes are logged as summaries: the first at once, then at
// most one line per handshakeSummaryEvery with the count since the last;
// every one is counted. Other server errors are logged as they come.
func TestServerErrorLogSummarisesHandshakes(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	counted := 0
	l := newServerErrorLog(slog.New(slog.NewJSONHandler(&buf, nil)), func() { counted++ }, func() time.Time { return now })
	fail := func(i int) {
		l.Printf("http: TLS handshake error from 127.0.0.1:%d: tls: client offered only unsupported versions", 40000+i)
	}
	for i := range 610 {
		fail(i)
	}
	now = now.Add(handshakeSummaryEvery)
	fail(610)
	l.Printf("http: Accept error: too many open files; retrying in 5ms")
	var lines []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, m)
	}
	if counted != 611 || len(lines) != 3 {
		t.Fatalf("counted %d, %d lines, want 611 and 3:\n%s", counted, len(lines), buf.String())
	}
	if lines[0]["count"] != 1.0 || lines[1]["count"] != 610.0 || lines[1]["last_remote"] != "127.0.0.1:40610" ||
		!strings.Contains(lines[1]["last_err"].(string), "unsupported versions") {
		t.Errorf("summaries %v, %v", lines[0], lines[1])
	}
	if lines[2]["level"] != "WARN" || !strings.HasPrefix(lines[2]["msg"].(string), "http: Accept error") {
		t.Errorf("another error: %v", lines[2])
	}
}
