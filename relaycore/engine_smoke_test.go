package relaycore_test

import (
	"testing"
)

func TestSmokeEnqueueAndDrain(t *testing.T) {
	e := newEnv(t, "free")
	res := e.enqueue(put("t1", "a", "1"), put("t2", "b", "2"), put("t1", "a", "3", "c", "4"))
	if got := res.Seqs; got[0] != 1 || got[2] != 2 || got[1] != 3 {
		t.Fatalf("seqs %v, want t1 rows contiguous first: [1 3 2]", got)
	}
	alarms, _ := e.drain(e.source, 10)
	if v, _ := e.target("t1", "a"); v != "3" {
		t.Fatalf("t1/a = %q", v)
	}
	if v, _ := e.target("t2", "b"); v != "2" {
		t.Fatalf("t2/b = %q", v)
	}
	v := e.inspect(e.source)
	if len(v.Pages) != 0 || v.Alarm != nil {
		t.Fatalf("outbox not empty after %d alarms: %+v", alarms, v)
	}
}
