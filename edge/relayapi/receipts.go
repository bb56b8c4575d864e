package relayapi

import (
	"context"
	"fmt"
	"net/http"

	bolt "go.etcd.io/bbolt"

	"github.com/relay-dev/relay/edge/segstore"
)

type receiptAnswer struct {
	Request  string `json:"request"`
	Accepted bool   `json:"accepted"`
	Replayed bool   `json:"replayed"`
}

// receiptPass posts every stored receipt without a verdict, in (segment,
// request) order. A refusal is the verdict (recorded, not retried); a
// retryable failure stops the pass.
func (a *Agent) receiptPass(ctx context.Context) error {
	todo, err := a.unposted()
	if err != nil {
		return err
	}
	a.setReceiptsPending(len(todo))
	for i, r := range todo {
		v, err := a.post(ctx, r)
		a.request(a.receipts, jobReceipts, err)
		if err != nil && retryable(err) {
			return fmt.Errorf("receipt %s for %s: %w", r.Request, r.ID, err)
		}
		if err := a.db.Update(func(tx *bolt.Tx) error {
			return putJSON(tx.Bucket(postedBucket), receiptKey(r.ID, r.Request), v)
		}); err != nil {
			return err
		}
		a.setReceiptsPending(len(todo) - i - 1)
	}
	return nil
}

// post sends one receipt and returns the relay's verdict: accepted, or
// refused with a 4xx (error non-nil and not retryable).
func (a *Agent) post(ctx context.Context, r segstore.StoredReceipt) (verdict, error) {
	body := append(append([]byte(nil), r.Receipt...), '\n') // one line of a receipt file
	var ans receiptAnswer
	err := a.call(ctx, http.MethodPost, "/v1/receipts", nil, body, &ans)
	if err == nil && (ans.Request != r.Request || !ans.Accepted) {
		err = &apiError{Message: fmt.Sprintf("POST /v1/receipts: the answer %+v is not an acceptance of request %q", ans, r.Request)}
	}
	switch {
	case err == nil:
		result := "accepted"
		if ans.Replayed {
			result = "replayed"
		}
		a.met.receipts.WithLabelValues(result).Inc()
		a.receipts.note(result)
		a.log.Info("takedown receipt accepted by the relay", "segment", r.ID, "request", r.Request, "replayed", ans.Replayed)
		return verdict{Accepted: true, Status: http.StatusOK, AtMS: a.now().UnixMilli()}, nil
	case retryable(err):
		return verdict{}, err
	}
	ae, _ := err.(*apiError)
	a.met.receipts.WithLabelValues("refused").Inc()
	a.receipts.refused(a.now(), fmt.Sprintf("%s for %s: %v", r.Request, r.ID, err))
	a.log.Error("takedown receipt refused by the relay; not posted again", "segment", r.ID, "request", r.Request, "err", err)
	return verdict{Status: ae.Status, Code: ae.Code, Message: ae.Message, AtMS: a.now().UnixMilli()}, err
}

// unposted lists the stored receipts the relay has given no verdict on.
// Only their keys are walked (in one read transaction, then the verdicts
// in another: bbolt read transactions must not nest), and only the
// receipts without a verdict are read: a node keeps every receipt it ever
// signed, and a pass that finds nothing new copies none of them.
func (a *Agent) unposted() ([]segstore.StoredReceipt, error) {
	var keys []segstore.StoredReceipt
	err := a.store.EachReceiptKey(func(id, request string) error {
		keys = append(keys, segstore.StoredReceipt{ID: id, Request: request})
		return nil
	})
	if err != nil {
		return nil, err
	}
	todo := keys[:0]
	err = a.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(postedBucket)
		for _, k := range keys {
			if b.Get(receiptKey(k.ID, k.Request)) == nil {
				todo = append(todo, k)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i := range todo {
		if todo[i].Receipt, err = a.store.Receipt(todo[i].ID, todo[i].Request); err != nil {
			return nil, err
		}
	}
	return todo, nil
}

// receiptKey is edge.receipts' key: id NUL request.
func receiptKey(id, request string) []byte {
	return append(append([]byte(id), 0), request...)
}
