package deploy

import (
	"errors"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// everywhere lists what no shipped binary may link, each with its reason.
var everywhere = map[string]string{
	"testing":           "test code: its flags, its runtime and everything a test helper drags in have no place in a product binary",
	"net/http/httptest": "a test server: it panics when it cannot listen and answers on whatever address it got; product endpoints are net/http servers (infra/dynamoemu)",
}

// emulator is the DynamoDB emulator (minidyn, behind infra/dynamoemu).
// Only relay links it, for `relay demo --store dynamo` without AWS.
const emulator = "github.com/truora/minidyn"

const noEmulator = "the DynamoDB emulator (minidyn) belongs to the relay demo only: this binary talks to DynamoDB itself or not at all, and must not carry a second, fake DynamoDB"

// dist is what `make dist` builds the commands for (DIST_PLATFORMS);
// lambda what sam.mk builds the functions for (linux/arm64, -tags
// lambda.norpc).
var (
	dist   = []platform{{goos: "linux", goarch: "amd64"}, {goos: "linux", goarch: "arm64"}, {goos: "linux", goarch: "arm", goarm: "7"}}
	lambda = []platform{{goos: "linux", goarch: "arm64", tags: "lambda.norpc"}}
)

type platform struct{ goos, goarch, goarm, tags string }

// binaries lists every main package under cmd/ and functions/, the
// platforms it ships for, and what it must never link beyond everywhere.
var binaries = map[string]struct {
	platforms []platform
	bad       map[string]string
}{
	"cmd/relay":       {platforms: dist},
	"cmd/edged":       {platforms: dist, bad: map[string]string{emulator: noEmulator}},
	"cmd/edgectl":     {platforms: dist, bad: map[string]string{emulator: noEmulator}},
	"functions/api":   {platforms: lambda, bad: map[string]string{emulator: noEmulator}},
	"functions/fire":  {platforms: lambda, bad: map[string]string{emulator: noEmulator}},
	"functions/sweep": {platforms: lambda, bad: map[string]string{emulator: noEmulator}},
}

// TestDeps checks, as tailscale's cmd/derper TestDeps does, that no
// shipped binary links a dependency listed against it (a package, or any
// package under that path), on every platform it ships for. A failure
// names the chain of imports that brought the dependency in.
func TestDeps(t *testing.T) {
	for _, p := range append(slices.Clone(dist), lambda...) {
		name := p.goos + "-" + p.goarch + p.goarm
		if p.tags != "" {
			name += "-" + p.tags
		}
		t.Run(name, func(t *testing.T) {
			pkgs := goList(t, p)
			var mains, want []string
			for path, pkg := range pkgs {
				if bin, ok := strings.CutPrefix(path, module+"/"); ok && pkg.name == "main" {
					mains = append(mains, bin)
				}
			}
			for bin := range binaries {
				want = append(want, bin)
			}
			slices.Sort(mains)
			slices.Sort(want)
			if !slices.Equal(mains, want) {
				t.Errorf("main packages under cmd/ and functions/ = %v, want %v: list every binary in binaries", mains, want)
			}
			for bin, b := range binaries {
				if !slices.Contains(b.platforms, p) {
					continue
				}
				bad := maps.Clone(everywhere)
				maps.Copy(bad, b.bad)
				for dep, why := range bad {
					if chain := importChain(pkgs, module+"/"+bin, dep); chain != nil {
						t.Errorf("%s links %s: %s\n\timported via %s", bin, chain[len(chain)-1], why, strings.Join(chain, " -> "))
					}
				}
			}
		})
	}
}

const module = "github.com/relay-dev/relay"

type listedPackage struct {
	name    string
	imports []string
}

// goList loads the main packages under cmd/ and functions/ and every
// package they depend on, as go build selects them for p.
func goList(t *testing.T, p platform) map[string]listedPackage {
	t.Helper()
	args := []string{"list", "-deps", "-f", `{{.ImportPath}}|{{.Name}}|{{join .Imports " "}}`}
	if p.tags != "" {
		args = append(args, "-tags", p.tags)
	}
	args = append(args, "./cmd/...", "./functions/...")
	cmd := exec.Command("go", args...)
	cmd.Dir = repoRoot
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0", "GOOS="+p.goos, "GOARCH="+p.goarch, "GOARM="+p.goarm)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	pkgs := map[string]listedPackage{}
	for line := range strings.Lines(string(out)) {
		f := strings.Split(strings.TrimSuffix(line, "\n"), "|")
		if len(f) != 3 {
			t.Fatalf("go list printed %q, want path|name|imports", line)
		}
		pkgs[f[0]] = listedPackage{name: f[1], imports: strings.Fields(f[2])}
	}
	return pkgs
}

// importChain returns the shortest chain of imports from the package from
// to dep or a package under dep, or nil when there is none.
func importChain(pkgs map[string]listedPackage, from, dep string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		path := queue[0]
		queue = queue[1:]
		if path == dep || strings.HasPrefix(path, dep+"/") {
			var chain []string
			for p := path; p != ""; p = prev[p] {
				chain = append(chain, p)
			}
			slices.Reverse(chain)
			return chain
		}
		for _, imp := range pkgs[path].imports {
			if _, seen := prev[imp]; !seen {
				prev[imp] = path
				queue = append(queue, imp)
			}
		}
	}
	return nil
}
