package relayapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	bolt "go.etcd.io/bbolt"

	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/takedown"
)

type holdingsBody struct {
	Reports []takedown.Report `json:"reports"`
}

type holdingsAnswer struct {
	Node     string `json:"node"`
	Accepted int    `json:"accepted"`
	Replayed bool   `json:"replayed"`
}

// pageSize is how many index entries or holdings one read transaction
// takes: short transactions, a bounded heap.
const pageSize = 256

// reportPass sends the batch left pending, if any, then reports what is
// owed, batch after batch, until nothing is. A pass a store started
// (kicked, with no walk owed) compares only the segments stored since the
// last pass (Stored): its cost follows the stores, not the size of the
// index. Every other pass (at start, every report_interval, after a
// takedown or a failed pass) walks the whole index against the holdings
// bucket, which finds what no store signalled: evictions of every kind. It
// returns the first error; the pending batch, if it was not refused, is
// sent first on the next pass, which then walks.
func (a *Agent) reportPass(ctx context.Context, kicked bool) error {
	stored := a.takeStored()
	var next func() ([]takedown.Report, error)
	if walk := a.walk.Swap(false); !kicked || walk {
		after := ""
		next = func() ([]takedown.Report, error) {
			reports, owed, err := a.diff(after, a.batch)
			if err != nil {
				return nil, err
			}
			a.met.holdingsPending.Set(float64(owed))
			a.holdings.setPending(owed)
			if len(reports) > 0 {
				after = reports[len(reports)-1].ContentID
			}
			return reports, nil
		}
	} else {
		next = func() ([]takedown.Report, error) {
			var out []takedown.Report
			for len(stored) > 0 && len(out) < a.batch {
				r, owed, err := a.diffOne(stored[0])
				if err != nil {
					return nil, err
				}
				stored = stored[1:]
				if owed {
					out = append(out, r)
				}
			}
			return out, nil
		}
	}
	err := a.sendOwed(ctx, next)
	if err != nil {
		a.walk.Store(true) // what this pass took may not have been sent
	}
	return err
}

// sendOwed sends the pending batch, then each batch next makes, until it
// makes none.
func (a *Agent) sendOwed(ctx context.Context, next func() ([]takedown.Report, error)) error {
	for {
		p, ok, err := a.pendingBatch()
		if err != nil {
			return err
		}
		if !ok {
			reports, err := next()
			if err != nil {
				return err
			}
			if len(reports) == 0 {
				return nil
			}
			if p, err = a.savePending(reports); err != nil {
				return err
			}
		}
		if err := a.sendPending(ctx, p); err != nil {
			return err
		}
	}
}

// pendingBatch returns the batch written and not yet answered.
func (a *Agent) pendingBatch() (pendingBatch, bool, error) {
	var p pendingBatch
	var ok bool
	err := a.db.View(func(tx *bolt.Tx) error {
		var err error
		ok, err = getJSON(tx.Bucket(metaBucket), keyPending, &p)
		return err
	})
	return p, ok, err
}

// savePending numbers a new batch and writes it, key and bytes, before
// anything is sent.
func (a *Agent) savePending(reports []takedown.Report) (pendingBatch, error) {
	body, err := json.Marshal(holdingsBody{Reports: reports})
	if err != nil {
		return pendingBatch{}, err
	}
	if len(body) > maxBodyBytes {
		// Cannot happen with 500 reports of ids within the wire's rule;
		// a guard, not a limit to rely on.
		return pendingBatch{}, fmt.Errorf("holdings batch of %d reports is %d bytes, over %d", len(reports), len(body), maxBodyBytes)
	}
	var p pendingBatch
	err = a.db.Update(func(tx *bolt.Tx) error {
		key, err := nextKey(tx)
		if err != nil {
			return err
		}
		p = pendingBatch{Key: key, Body: body}
		return putJSON(tx.Bucket(metaBucket), keyPending, p)
	})
	return p, err
}

// sendPending posts p. On 200 the holdings bucket takes its reports and
// the batch is dropped, in one transaction. A refusal (4xx) drops the
// batch without applying it: its reports are still owed, and the next
// pass sends them again in a batch of its own, under a new key. Anything
// else keeps it for the retry.
func (a *Agent) sendPending(ctx context.Context, p pendingBatch) error {
	var body holdingsBody
	if err := json.Unmarshal(p.Body, &body); err != nil {
		return fmt.Errorf("pending holdings batch %s: %w", p.Key, err)
	}
	var ans holdingsAnswer
	err := a.call(ctx, http.MethodPost, "/v1/holdings", http.Header{"Idempotency-Key": {p.Key}}, p.Body, &ans)
	if err == nil && ans.Node != a.node {
		err = &apiError{Refused: true, Message: fmt.Sprintf("POST /v1/holdings: the relay took the reports as node %q's, not %q's: check its identity mapping", ans.Node, a.node)}
	}
	if err != nil {
		a.request(a.holdings, jobHoldings, err)
		if !retryable(err) {
			if ae, ok := err.(*apiError); ok && ae.Status == http.StatusRequestEntityTooLarge && a.batch > 1 {
				// The relay's own bound on one idempotent request is below
				// relay_api.batch reports: ask less of it from now on.
				a.batch = max(1, min(a.batch, len(body.Reports))/2)
			}
			a.log.Error("relay refused holdings batch; its reports are sent again in a new batch at the next pass",
				"key", p.Key, "reports", len(body.Reports), "batch", a.batch, "err", err)
			if derr := a.dropPending(p.Key); derr != nil {
				return errors.Join(err, derr)
			}
		}
		return fmt.Errorf("holdings batch %s: %w", p.Key, err)
	}
	a.request(a.holdings, jobHoldings, nil)
	err = a.db.Update(func(tx *bolt.Tx) error {
		h := tx.Bucket(holdingsBucket)
		for _, r := range body.Reports {
			var err error
			if r.State == takedown.StateHeld {
				err = putJSON(h, []byte(r.ContentID), reported{SHA256: r.SHA256, Size: r.Size})
			} else {
				err = h.Delete([]byte(r.ContentID))
			}
			if err != nil {
				return err
			}
		}
		return tx.Bucket(metaBucket).Delete(keyPending)
	})
	if err != nil {
		return err
	}
	for _, r := range body.Reports {
		a.met.reported.WithLabelValues(r.State).Inc()
	}
	a.holdings.sent(len(body.Reports))
	a.log.Info("holdings reported", "key", p.Key, "reports", len(body.Reports), "replayed", ans.Replayed)
	return nil
}

// dropPending removes the pending batch if it is still key's.
func (a *Agent) dropPending(key string) error {
	return a.db.Update(func(tx *bolt.Tx) error {
		var p pendingBatch
		if ok, err := getJSON(tx.Bucket(metaBucket), keyPending, &p); err != nil || !ok || p.Key != key {
			return err
		}
		return tx.Bucket(metaBucket).Delete(keyPending)
	})
}

// heldReport is the report that this node holds e.
func heldReport(e segstore.Entry) takedown.Report {
	return takedown.Report{ContentID: e.ID, SHA256: e.SHA256, Size: e.Size, State: takedown.StateHeld, ObservedMS: e.Received.UnixMilli()}
}

// diff walks the index and the holdings bucket together in id order,
// from after ("" = the start), and returns the first limit reports owed
// and how many are owed in all from there.
func (a *Agent) diff(after string, limit int) ([]takedown.Report, int, error) {
	ix := &pager[segstore.Entry]{after: after, load: a.store.ListAfter, id: func(e segstore.Entry) string { return e.ID }}
	hs := &pager[heldEntry]{after: after, load: a.listHeld, id: func(h heldEntry) string { return h.id }}
	var out []takedown.Report
	owed := 0
	add := func(r takedown.Report) {
		owed++
		if len(out) < limit {
			out = append(out, r)
		}
	}
	for {
		e, eok, err := ix.peek()
		if err != nil {
			return nil, 0, err
		}
		h, hok, err := hs.peek()
		if err != nil {
			return nil, 0, err
		}
		switch {
		case !eok && !hok:
			return out, owed, nil
		case eok && (!hok || e.ID < h.id):
			add(heldReport(e))
			ix.next()
		case hok && (!eok || h.id < e.ID):
			if len(out) < limit {
				add(a.evictedReport(h))
			} else {
				owed++
			}
			hs.next()
		default:
			if e.SHA256 != h.SHA256 || e.Size != h.Size {
				add(heldReport(e))
			}
			ix.next()
			hs.next()
		}
	}
}

// diffOne is diff for one segment: the report owed for id, if any.
func (a *Agent) diffOne(id string) (takedown.Report, bool, error) {
	e, err := a.store.Stat(id)
	indexed := err == nil
	if err != nil && !errors.Is(err, segstore.ErrNotFound) {
		return takedown.Report{}, false, err
	}
	h := heldEntry{id: id}
	var held bool
	if err := a.db.View(func(tx *bolt.Tx) error {
		var err error
		held, err = getJSON(tx.Bucket(holdingsBucket), []byte(id), &h.reported)
		return err
	}); err != nil {
		return takedown.Report{}, false, err
	}
	switch {
	case indexed && (!held || e.SHA256 != h.SHA256 || e.Size != h.Size):
		return heldReport(e), true, nil
	case !indexed && held:
		return a.evictedReport(h), true, nil
	}
	return takedown.Report{}, false, nil
}

// evictedReport is h reported evicted, at its tombstone's time if it was
// taken down, else now (when the pass noticed it).
func (a *Agent) evictedReport(h heldEntry) takedown.Report {
	at := a.now()
	if t, err := a.store.TombstoneOf(h.id); err == nil {
		at = t.EvictedAt
	}
	return takedown.Report{ContentID: h.id, SHA256: h.SHA256, Size: h.Size, State: takedown.StateEvicted, ObservedMS: at.UnixMilli()}
}

type heldEntry struct {
	id string
	reported
}

// listHeld is ListAfter for the holdings bucket.
func (a *Agent) listHeld(after string, limit int) ([]heldEntry, error) {
	var out []heldEntry
	err := a.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(holdingsBucket).Cursor()
		k, v := c.Seek([]byte(after))
		if k != nil && after != "" && bytes.Equal(k, []byte(after)) {
			k, v = c.Next()
		}
		for ; k != nil && len(out) < limit; k, v = c.Next() {
			h := heldEntry{id: string(k)}
			if err := json.Unmarshal(v, &h.reported); err != nil {
				return fmt.Errorf("holdings entry %q: %w", k, err)
			}
			out = append(out, h)
		}
		return nil
	})
	return out, err
}

// pager walks a listing one page (one read transaction) at a time.
type pager[T any] struct {
	after string
	load  func(after string, limit int) ([]T, error)
	id    func(T) string
	page  []T
	done  bool
}

func (p *pager[T]) peek() (T, bool, error) {
	var zero T
	if len(p.page) == 0 && !p.done {
		page, err := p.load(p.after, pageSize)
		if err != nil {
			return zero, false, err
		}
		p.page, p.done = page, len(page) < pageSize
		if len(page) > 0 {
			p.after = p.id(page[len(page)-1])
		}
	}
	if len(p.page) == 0 {
		return zero, false, nil
	}
	return p.page[0], true, nil
}

func (p *pager[T]) next() { p.page = p.page[1:] }
