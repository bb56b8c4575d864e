// Command vulngate decides whether a govulncheck scan passes. It reads
// govulncheck's JSON stream (-format json) on standard input and fails on
// every vulnerability the code calls unless the accepted list names it
// with a reason. Accepted entries the scan does not find are listed, not
// failed: a developer on a newer patch release of Go has fewer standard
// library findings than CI. Vulnerabilities only in imported packages or
// required modules are counted, not judged: govulncheck's own text mode
// does not fail on them either.
//
// `make vuln` runs it after govulncheck against a database built from the
// pinned golang.org/x/vulndb module, without the network.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

// finding is one govulncheck finding, reduced to what the gate judges.
type finding struct {
	id, module, version, fixed string
	called                     bool // reached from the code (symbol level)
}

// scan is a parsed govulncheck JSON stream.
type scan struct {
	scanner, db, goVersion, level string
	findings                      []finding
}

// parseScan reads govulncheck's stream of JSON messages. It needs the
// config message, which tells that govulncheck ran at all.
func parseScan(r io.Reader) (scan, error) {
	var s scan
	var sawConfig bool
	dec := json.NewDecoder(r)
	for {
		var msg struct {
			Config *struct {
				ScannerVersion string `json:"scanner_version"`
				DB             string `json:"db"`
				GoVersion      string `json:"go_version"`
				ScanLevel      string `json:"scan_level"`
			} `json:"config"`
			Finding *struct {
				OSV          string `json:"osv"`
				FixedVersion string `json:"fixed_version"`
				Trace        []struct {
					Module   string `json:"module"`
					Version  string `json:"version"`
					Function string `json:"function"`
				} `json:"trace"`
			} `json:"finding"`
		}
		err := dec.Decode(&msg)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return scan{}, fmt.Errorf("read govulncheck output: %w", err)
		}
		if c := msg.Config; c != nil {
			sawConfig = true
			s.scanner, s.db, s.goVersion, s.level = c.ScannerVersion, c.DB, c.GoVersion, c.ScanLevel
		}
		if f := msg.Finding; f != nil {
			if len(f.Trace) == 0 || f.OSV == "" {
				return scan{}, fmt.Errorf("finding %q without a trace", f.OSV)
			}
			top := f.Trace[0]
			s.findings = append(s.findings, finding{f.OSV, top.Module, top.Version, f.FixedVersion, top.Function != ""})
		}
	}
	if !sawConfig {
		return scan{}, errors.New("no govulncheck config message: did govulncheck run with -format json?")
	}
	return s, nil
}

var idPattern = regexp.MustCompile(`^GO-[0-9]{4}-[0-9]+$`)

// parseAccepted reads the accepted list: one `GO-YYYY-NNNN reason` per
// line; blank lines and lines starting with # are ignored. Every entry
// needs a reason, and an ID may appear once.
func parseAccepted(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, reason, _ := strings.Cut(line, " ")
		reason = strings.TrimSpace(reason)
		switch {
		case !idPattern.MatchString(id):
			return nil, fmt.Errorf("line %d: %q is not a Go vulnerability ID (GO-YYYY-NNNN)", n, id)
		case reason == "":
			return nil, fmt.Errorf("line %d: %s has no reason", n, id)
		case out[id] != "":
			return nil, fmt.Errorf("line %d: %s listed twice", n, id)
		}
		out[id] = reason
	}
	return out, sc.Err()
}

// judge writes one line per called vulnerability and per unused
// acceptance, and reports whether the scan passes.
func judge(w io.Writer, s scan, accepted map[string]string) bool {
	ok := true
	if s.level != "symbol" {
		fmt.Fprintf(w, "FAIL: scan level %q; the accepted list is about called code, run govulncheck at symbol level\n", s.level)
		ok = false
	}
	called := map[string]finding{}
	other := map[string]bool{}
	for _, f := range s.findings {
		if f.called {
			called[f.id] = f
		} else {
			other[f.id] = true
		}
	}
	ids := make([]string, 0, len(called))
	for id := range called {
		ids = append(ids, id)
		delete(other, id)
	}
	slices.Sort(ids)
	nAccepted := 0
	for _, id := range ids {
		f := called[id]
		where := fmt.Sprintf("%s@%s, fixed in %s", f.module, f.version, orNone(f.fixed))
		if reason, ok := accepted[id]; ok {
			fmt.Fprintf(w, "accepted    %s (%s): %s\n", id, where, reason)
			nAccepted++
			continue
		}
		fmt.Fprintf(w, "VULNERABLE  %s (%s): called; fix it or accept it with a reason\n", id, where)
		ok = false
	}
	var stale []string
	for id := range accepted {
		if _, found := called[id]; !found {
			stale = append(stale, id)
		}
	}
	slices.Sort(stale)
	for _, id := range stale {
		fmt.Fprintf(w, "unused      %s is accepted but not called (a newer Go, or the code moved): remove it from the list once no supported toolchain needs it\n", id)
	}
	fmt.Fprintf(w, "govulncheck %s, %s, %s: %d called (%d accepted), %d more in imported packages or required modules only\n",
		s.scanner, s.goVersion, s.db, len(called), nAccepted, len(other))
	return ok
}

func orNone(s string) string {
	if s == "" {
		return "no release"
	}
	return s
}
