package relayapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	bolt "go.etcd.io/bbolt"

	"github.com/relay-dev/relay/edge/segstore"
	"github.com/relay-dev/relay/edge/takedown"
)

type ordersAnswer struct {
	Node   string           `json:"node"`
	Orders []takedown.Order `json:"orders"`
	Next   string           `json:"next"`
}

// Results of an order (edged_relayapi_orders_total).
const (
	orderEvicted = "evicted"  // the segment was removed and a receipt signed
	orderReceipt = "receipt"  // taken down before; the receipt for this request stored
	orderNotHeld = "not_held" // neither held nor taken down here: nothing signed
	orderInvalid = "invalid"  // the order's ids break the rules: nothing done
)

// orderPass reads the orders after the cursor, page after page, and
// applies each. The cursor moves past an order once it is handled for
// good; the first order that cannot be handled now stops the pass.
func (a *Agent) orderPass(ctx context.Context) error {
	cursor, err := a.cursor()
	if err != nil {
		return err
	}
	for {
		q := url.Values{"limit": {strconv.Itoa(a.cfg.Batch)}}
		if cursor != "" {
			q.Set("after", cursor)
		}
		var ans ordersAnswer
		err := a.call(ctx, http.MethodGet, "/v1/orders?"+q.Encode(), nil, nil, &ans)
		if err == nil && ans.Node != a.node {
			err = &apiError{Refused: true, Message: fmt.Sprintf("GET /v1/orders: the relay answered with node %q's orders, not %q's: nothing applied", ans.Node, a.node)}
		}
		a.request(a.orders, jobOrders, err)
		if err != nil {
			return fmt.Errorf("orders after %q: %w", cursor, err)
		}
		for _, o := range ans.Orders {
			if o.Cursor == "" {
				return &apiError{Message: fmt.Sprintf("GET /v1/orders: order %q without a cursor: nothing more applied", o.Request)}
			}
			if err := a.apply(o); err != nil {
				return err
			}
			if err := a.setCursor(o.Cursor); err != nil {
				return err
			}
			cursor = o.Cursor
		}
		if ans.Next == "" {
			return nil
		}
		if len(ans.Orders) == 0 && ans.Next == cursor {
			return nil // a relay that points at where we are: nothing new
		}
		if err := a.setCursor(ans.Next); err != nil {
			return err
		}
		cursor = ans.Next
	}
}

// apply evicts for one order. nil means handled for good: evicted,
// taken down before, or refused for reasons that do not go away (the
// segment is not here, the ids are malformed). An error leaves the order
// to be asked again.
func (a *Agent) apply(o takedown.Order) error {
	if err := orderProblem(o); err != nil {
		a.met.orders.WithLabelValues(orderInvalid).Inc()
		a.orders.note(orderInvalid)
		a.log.Error("takedown order refused: malformed; nothing done", "request", o.Request, "segment", o.ContentID, "err", err)
		return nil
	}
	evicted, err := a.evict(o.ContentID, o.Request)
	switch {
	case errors.Is(err, segstore.ErrNotFound):
		a.met.orders.WithLabelValues(orderNotHeld).Inc()
		a.orders.note(orderNotHeld)
		a.log.Warn("takedown order for a segment this node neither holds nor took down: nothing signed, the relay keeps this node pending until an operator waives it",
			"request", o.Request, "segment", o.ContentID, "sha256", o.SHA256, "takedown", o.Takedown)
		return nil
	case err != nil:
		return fmt.Errorf("takedown order %s: %w", o.Request, err)
	}
	result := orderReceipt
	if evicted {
		result = orderEvicted
	}
	a.met.orders.WithLabelValues(result).Inc()
	a.orders.note(result)
	a.log.Info("takedown order applied", "request", o.Request, "segment", o.ContentID, "takedown", o.Takedown,
		"reason", o.Reason, "evicted_now", evicted)
	a.kick(a.receiptsKick)
	a.kick(a.holdingsKick)
	return nil
}

// orderProblem checks what the eviction and its receipt take from an
// order.
func orderProblem(o takedown.Order) error {
	if err := segstore.ValidID(o.ContentID); err != nil {
		return err
	}
	return takedown.CheckRequestID(o.Request)
}

func (a *Agent) cursor() (string, error) {
	var c string
	err := a.db.View(func(tx *bolt.Tx) error {
		c = string(tx.Bucket(metaBucket).Get(keyCursor))
		return nil
	})
	return c, err
}

func (a *Agent) setCursor(c string) error {
	err := a.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(metaBucket).Put(keyCursor, []byte(c)) })
	if err == nil {
		a.orders.setCursor(c)
	}
	return err
}
