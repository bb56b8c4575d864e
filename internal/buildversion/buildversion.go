// Package buildversion says what a binary was built from, as the Go
// toolchain recorded it in the binary's build info: the module version
// (a tag, or a pseudo-version naming the commit), the VCS commit and its
// time, whether the work tree had uncommitted changes, the Go version and
// the target platform. Nothing has to be stamped by hand, so `make dist`,
// `go build` and `go install` all produce binaries that can say what they
// are; an operator compares it with SHA256SUMS and the release notes.
package buildversion

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// commit is the VCS commit when the build info lacks one, stamped by
// `make dist` (-ldflags -X): the go command records no VCS information in a
// git worktree (its .git is a file) or with -buildvcs=false.
var commit string

// String describes the running binary, e.g.
//
//	v0.0.0-20261130120000-0123456789ab (commit 0123456789abcdef0123456789abcdef01234567, 2026-11-30T12:00:00Z; go1.26.0 linux/arm v7)
func String() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown (no build info)"
	}
	if commit != "" && !hasSetting(bi, "vcs.revision") {
		bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs.revision", Value: commit})
	}
	return FromBuildInfo(bi)
}

func hasSetting(bi *debug.BuildInfo, key string) bool {
	for _, s := range bi.Settings {
		if s.Key == key && s.Value != "" {
			return true
		}
	}
	return false
}

// FromBuildInfo describes a binary from its build info.
func FromBuildInfo(bi *debug.BuildInfo) string {
	set := map[string]string{}
	for _, s := range bi.Settings {
		set[s.Key] = s.Value
	}
	version := bi.Main.Version
	if version == "" {
		version = "(devel)"
	}
	var vcs []string
	if rev := set["vcs.revision"]; rev != "" {
		c := "commit " + rev
		if set["vcs.modified"] == "true" {
			c += " with uncommitted changes"
		}
		vcs = append(vcs, c)
	}
	if t := set["vcs.time"]; t != "" {
		vcs = append(vcs, t)
	}
	platform := set["GOOS"] + "/" + set["GOARCH"]
	switch {
	case set["GOARM"] != "":
		platform += " v" + set["GOARM"]
	case set["GOAMD64"] != "" && set["GOAMD64"] != "v1":
		platform += " " + set["GOAMD64"]
	}
	build := strings.TrimSpace(bi.GoVersion + " " + strings.Trim(platform, "/"))
	if len(vcs) == 0 {
		return fmt.Sprintf("%s (%s)", version, build)
	}
	return fmt.Sprintf("%s (%s; %s)", version, strings.Join(vcs, ", "), build)
}
