package buildversion

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"release build from a tag", debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.0"},
			Settings: []debug.BuildSetting{{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "arm"}, {Key: "GOARM", Value: "7"},
				{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.time", Value: "2026-11-30T12:00:00Z"}, {Key: "vcs.modified", Value: "false"}}},
			"v1.4.0 (commit 0123456789abcdef, 2026-11-30T12:00:00Z; go1.26.0 linux/arm v7)"},
		{"dirty tree", debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.0.0-20261130120000-0123456789ab+dirty"},
			Settings: []debug.BuildSetting{{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "arm64"},
				{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.modified", Value: "true"}}},
			"v0.0.0-20261130120000-0123456789ab+dirty (commit 0123456789abcdef with uncommitted changes; go1.26.0 linux/arm64)"},
		{"no vcs (go run, a test binary)", debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "amd64"}, {Key: "GOAMD64", Value: "v1"}}},
			"(devel) (go1.26.0 linux/amd64)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FromBuildInfo(&tc.bi); got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

// The running test binary has build info of its own.
func TestString(t *testing.T) {
	if s := String(); !strings.Contains(s, "go1.") {
		t.Fatalf("String() = %q", s)
	}
}
