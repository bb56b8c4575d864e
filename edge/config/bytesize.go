package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ByteSize is a size in bytes. In YAML it is a plain integer (1048576) or
// an integer with a unit: KiB, MiB, GiB, TiB (powers of 1024) or KB, MB,
// GB, TB (powers of 1000); "B" is also accepted. No fractions: a quota is
// exact.
type ByteSize int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	// Longest suffixes first so "MiB" is not read as "B".
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"B", 1},
}

// ParseByteSize parses "123", "64MiB" or "1 GB".
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range byteUnits {
		if n, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size (e.g. 1048576, 64MiB, 1GB)", s)
	}
	if n != 0 && (n > math.MaxInt64/mult || n < math.MinInt64/mult) {
		return 0, fmt.Errorf("%q overflows a 64-bit byte count", s)
	}
	return ByteSize(n * mult), nil
}

// UnmarshalYAML accepts an integer or a string with a unit.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: a size must be a scalar", n.Line)
	}
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*b = v
	return nil
}

// String prints the size with the largest binary unit that divides it.
func (b ByteSize) String() string {
	for i := 3; i >= 0; i-- {
		u := byteUnits[i]
		if b != 0 && int64(b)%u.mult == 0 {
			return strconv.FormatInt(int64(b)/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}

// UnmarshalYAML accepts what ByteSize does; checkSchema has refused values
// ≤ 0 already.
func (r *Rate) UnmarshalYAML(n *yaml.Node) error {
	var b ByteSize
	if err := b.UnmarshalYAML(n); err != nil {
		return err
	}
	*r = Rate(b)
	return nil
}

// String prints the rate as a size per second, or "unlimited".
func (r Rate) String() string {
	if r <= 0 {
		return "unlimited"
	}
	return ByteSize(r).String() + "/s"
}
