package api

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/relay-dev/relay/relaycore"
)

// TestAnswersDocumented: every answer in the error tables is a row of
// docs/api.md's error table (its status and code together) and named in
// docs/openapi.yaml; each answers its engine error however it is wrapped,
// with retry-after on a 503 and the typed errors' details; and an error in
// neither table passes through (operator) or is 500 internal (enqueue).
func TestAnswersDocumented(t *testing.T) {
	md, err := os.ReadFile(filepath.Join("..", "..", "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	oa, err := os.ReadFile(filepath.Join("..", "..", "docs", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	documented := func(status int, code string) bool {
		for line := range strings.Lines(string(md)) {
			cells := strings.Split(line, "|")
			if len(cells) > 3 && strings.Contains(cells[1], strconv.Itoa(status)) && strings.Contains(cells[2], "`"+code+"`") {
				return true
			}
		}
		return false
	}
	for name, table := range map[string][]answer{"operator": operatorAnswers, "enqueue": enqueueAnswers, "store": storeAnswers} {
		for _, a := range table {
			if !documented(a.status, a.code) || !strings.Contains(string(oa), a.code) {
				t.Errorf("%s: %d %s (for %v) is not in docs/api.md's error table or docs/openapi.yaml", name, a.status, a.code, a.err)
			}
			wrapped := fmt.Errorf("orders: %w", a.err)
			e := answerFor(table, wrapped)
			if e == nil || e.status != a.status || e.code != a.code || !strings.Contains(e.message, wrapped.Error()) {
				t.Errorf("%s: %v answered %+v, want %d %s", name, wrapped, e, a.status, a.code)
				continue
			}
			if (e.retryAfter == "1") != (a.status == 503) {
				t.Errorf("%s: %s retry-after %q", name, a.code, e.retryAfter)
			}
		}
	}
	sc := answerFor(operatorAnswers, fmt.Errorf("x: %w", &relaycore.SkipConflictError{Target: "t", Expected: 2, Actual: 5}))
	if sc == nil || sc.code != "skip_conflict" || sc.actualFirst == nil || *sc.actualFirst != 5 {
		t.Errorf("skip conflict answered %+v", sc)
	}
	ws := operatorError(&relaycore.TargetStateError{Target: "t", State: relaycore.StateActive, Action: relaycore.ActionRelease})
	if e, ok := errors.AsType[*apiError](ws); !ok || e.status != 409 || e.code != "wrong_state" {
		t.Errorf("wrong state answered %v", ws)
	}
	row := enqueueError(&relaycore.RowError{Index: 3, Reason: "bad"}, relaycore.CommitResult{Seqs: []uint64{7}})
	if e, ok := errors.AsType[*apiError](row); !ok || e.code != "invalid_row" || e.row == nil || *e.row != 3 || e.seqs != nil {
		t.Errorf("row error answered %+v", row)
	}
	busy := enqueueError(relaycore.ErrContention, relaycore.CommitResult{Seqs: []uint64{7, 0}})
	if e, ok := errors.AsType[*apiError](busy); !ok || e.code != "unavailable" || len(e.seqs) != 2 {
		t.Errorf("contention after a committed batch answered %+v", busy)
	}
	other := errors.New("disk on fire")
	if got := operatorError(other); got != other {
		t.Errorf("operatorError(%v) = %v, want it passed through", other, got)
	}
	if e, ok := errors.AsType[*apiError](enqueueError(other, relaycore.CommitResult{})); !ok || e.status != 500 || e.code != "internal" || e.seqs != nil {
		t.Errorf("enqueueError(%v) = %+v, want 500 internal", other, e)
	}
}
