package relaycore

// Internals the external tests size their fixtures with, so a boundary test
// sits exactly where the engine draws the line.
const (
	// RSMaxBytes is the bound on an encoded rs a fire checkpoint keeps room
	// for beside the pages it may rewrite.
	RSMaxBytes = rsMaxBytes
)

// PageRewriteBound is the largest encoding of any suffix of p's rows: what
// a fire reserves in its checkpoint for a page it may rewrite.
func PageRewriteBound(p Page) int { return pageRewriteBound(p) }
