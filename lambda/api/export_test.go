package api

// The enqueue body's two decoders, for FuzzParseRows and the tests that
// the scanner takes the bodies it should and no other.
var (
	ParseRowsFast = parseRowsFast
	ParseRowsJSON = parseRowsJSON
)
