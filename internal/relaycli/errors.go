package relaycli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"
)

// A command run with --json that fails prints, besides the prose on
// stderr, one JSON object on stdout, so a script reads why without parsing
// prose (docs/operations.md, "Scripts"):
//
//	{"error":{"code":"skip_conflict","message":"...","status":409,"actual_first":4}}
//
// When the API answered (in process or through --url), code, actual_first
// and row are its error body's and status its HTTP status. Otherwise code
// is one of the CLI's own, in this table.
const (
	// codeUsage: the flags or arguments are wrong; nothing was tried.
	codeUsage = "usage"
	// codeLocked: the bbolt file is held by another process (a running
	// relay serve): use --url.
	codeLocked = "locked"
	// codeNoAnswer: the server named by --url gave no answer (refused
	// connection, TLS failure, cut response). maybe_applied says an
	// action was sent in full, so it may have been applied.
	codeNoAnswer = "no_answer"
	// codeFailed: anything else (a storage error, a missing file).
	codeFailed = "failed"
)

// errorJSON is the --json error object.
type errorJSON struct {
	Error errorJSONDetail `json:"error"`
}

type errorJSONDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Status is the HTTP status of the API's answer (absent when the
	// API did not answer).
	Status       int     `json:"status,omitempty"`
	ActualFirst  *uint64 `json:"actual_first,omitempty"`
	Row          *int    `json:"row,omitempty"`
	MaybeApplied bool    `json:"maybe_applied,omitempty"`
}

// errorObject maps err to the --json error object: the one table from the
// CLI's errors to codes.
func errorObject(err error) errorJSON {
	d := errorJSONDetail{Code: codeFailed, Message: err.Error()}
	var (
		ae *apiError
		na *noAnswerError
		le *lockedError
		ue *usageError
	)
	switch {
	case errors.As(err, &ae):
		d.Code, d.Status, d.ActualFirst, d.Row = ae.body.Error.Code, ae.status, ae.body.Error.ActualFirst, ae.body.Error.Row
	case errors.As(err, &na):
		d.Code, d.MaybeApplied = codeNoAnswer, na.maybeApplied
	case errors.As(err, &le):
		d.Code = codeLocked
	case errors.As(err, &ue):
		d.Code = codeUsage
	}
	return errorJSON{Error: d}
}

// usageError: the command line is wrong.
type usageError struct{ error }

func (e *usageError) Unwrap() error { return e.error }

func usageErrorf(format string, a ...any) error {
	return &usageError{fmt.Errorf(format, a...)}
}

// reportedError: the command already printed its --json answer for this
// failure (relay demo's summary says what failed), so no error object
// follows it.
type reportedError struct{ error }

func (e *reportedError) Unwrap() error { return e.error }

// wantsJSON reports whether the command that ran was asked for --json.
// When its flags did not parse, the flag may not be set yet: then the
// arguments are looked at as given.
func wantsJSON(cmd *cobra.Command, args []string) bool {
	if cmd == nil || cmd.Flags().Lookup("json") == nil {
		return false
	}
	if v, err := cmd.Flags().GetBool("json"); err == nil && v {
		return true
	}
	if i := slices.Index(args, "--"); i >= 0 {
		args = args[:i]
	}
	return slices.Contains(args, "--json") || slices.Contains(args, "--json=true")
}

// printError writes err's error object to w.
func printError(w io.Writer, err error) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(errorObject(err))
}

// wrapUsage makes the argument checks of c and its subcommands return
// usage errors, so --json reports them as code usage.
func wrapUsage(c *cobra.Command) {
	if args := c.Args; args != nil {
		c.Args = func(cmd *cobra.Command, a []string) error {
			if err := args(cmd, a); err != nil {
				return &usageError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		wrapUsage(sub)
	}
}
