package takedown

// The records of the takedown API between edged and the relay
// (docs/takedown.md): what a node reports it holds (POST /v1/holdings) and
// the orders it pulls (GET /v1/orders). They are declared once here, beside
// the receipt that answers an order, so the relay (relaycore/takedowns,
// lambda/api) and the agent (edge/relayapi) encode the same fields; only
// the contract test server (edge/relayapi/relayapitest) keeps copies of
// its own, on purpose, to check the agent against the contract as written
// rather than against this code.

// States of a Report.
const (
	StateHeld    = "held"    // the node stores the content with that digest
	StateEvicted = "evicted" // it no longer does; SHA256 is the digest it had
)

// Report is one holder report: the node holds (State StateHeld) or no
// longer holds (StateEvicted) content ContentID, whose digest is SHA256, as
// it observed at ObservedMS (the node's clock).
type Report struct {
	ContentID  string `json:"content_id"`
	SHA256     string `json:"sha256"`
	Size       int64  `json:"size"`
	State      string `json:"state"`
	ObservedMS int64  `json:"observed_ms"`
}

// Order asks a node to evict ContentID (digest SHA256, as the holder index
// had it) for Request, the per-holder request id its receipt must name.
// Cursor orders a node's orders; the relay sets it when it hands them out.
type Order struct {
	Cursor      string `json:"cursor,omitempty"`
	Request     string `json:"request"`
	ContentID   string `json:"content_id"`
	SHA256      string `json:"sha256"`
	Takedown    string `json:"takedown"`
	Reason      string `json:"reason"`
	RequestedMS int64  `json:"requested_ms"`
}
