package relayserve

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// reloadableKeys are the configuration keys a reload (SIGHUP) applies to
// a running server, as YAML paths; a key below one of them is reloadable
// too. They are read per request, so a swap of the authenticator is all
// it takes. Every other key is read once at start (the listener, the
// store, the alarm clock, the HTTP server's limits, the logger): a
// change to one needs a restart, and a reload that finds one refuses the
// whole file.
var reloadableKeys = []string{"principals", "auth.tokens_file", "auth.anonymous"}

// reloadable reports whether key (a YAML path) is or is under one of
// reloadableKeys.
func reloadable(key string) bool {
	for _, k := range reloadableKeys {
		if key == k || strings.HasPrefix(key, k+".") {
			return true
		}
	}
	return false
}

// changedKeys returns the YAML paths of the keys whose values differ
// between a and b, sorted. It walks Config by reflection over the yaml
// tags, so a key added to Config later is compared without anyone
// remembering to: structs of this package are walked field by field,
// maps key by key (a principal added, removed or changed is
// principals.<name>), pointers through (nil and non-nil differ at the
// pointer's key), and everything else is compared whole.
func changedKeys(a, b Config) []string {
	out := []string{} // logged: [] reads better than null
	diffValues(nil, reflect.ValueOf(a), reflect.ValueOf(b), &out)
	slices.Sort(out)
	return out
}

// restartKeys are those of keys that are not reloadable.
func restartKeys(keys []string) []string {
	var out []string
	for _, k := range keys {
		if !reloadable(k) {
			out = append(out, k)
		}
	}
	return out
}

var configPkg = reflect.TypeFor[Config]().PkgPath()

func diffValues(path []string, a, b reflect.Value, out *[]string) {
	key := func() string { return strings.Join(path, ".") }
	switch a.Kind() {
	case reflect.Struct:
		if a.Type().PkgPath() != configPkg {
			// Another package's struct (none today) is one value: its
			// fields are not keys of the file.
			if !reflect.DeepEqual(a.Interface(), b.Interface()) {
				*out = append(*out, key())
			}
			return
		}
		for i := range a.NumField() {
			f := a.Type().Field(i)
			name := yamlName(f)
			if name == "" {
				continue
			}
			diffValues(append(path[:len(path):len(path)], name), a.Field(i), b.Field(i), out)
		}
	case reflect.Pointer:
		switch {
		case a.IsNil() && b.IsNil():
		case a.IsNil() || b.IsNil():
			*out = append(*out, key())
		default:
			diffValues(path, a.Elem(), b.Elem(), out)
		}
	case reflect.Map:
		keys := map[string]reflect.Value{}
		for _, m := range []reflect.Value{a, b} {
			for _, k := range m.MapKeys() {
				keys[fmt.Sprint(k.Interface())] = k
			}
		}
		names := make([]string, 0, len(keys))
		for n := range keys {
			names = append(names, n)
		}
		slices.SortFunc(names, cmp.Compare)
		for _, n := range names {
			k := keys[n]
			av, bv := a.MapIndex(k), b.MapIndex(k)
			p := append(path[:len(path):len(path)], n)
			if !av.IsValid() || !bv.IsValid() {
				*out = append(*out, strings.Join(p, "."))
				continue
			}
			diffValues(p, av, bv, out)
		}
	case reflect.Slice:
		// An absent list and an empty one say the same.
		if a.Len() == 0 && b.Len() == 0 {
			return
		}
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			*out = append(*out, key())
		}
	default:
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			*out = append(*out, key())
		}
	}
}

// yamlName is the key of a struct field in the file: its yaml tag's name
// ("" for a field the file cannot set).
func yamlName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	switch name {
	case "-":
		return ""
	case "":
		return strings.ToLower(f.Name) // what go.yaml.in/yaml/v3 does without a tag
	}
	return name
}

// restartError refuses a reload whose file changed keys that are read
// only at start; Keys are their YAML paths, sorted.
type restartError struct{ Keys []string }

func (e *restartError) Error() string {
	return fmt.Sprintf("%s changed: read only at start, so a restart is needed to apply them (or put them back to reload the rest; only %s reload)",
		strings.Join(e.Keys, ", "), strings.Join(reloadableKeys, ", "))
}

// reloader applies a reload to a running server: the configuration file
// re-read and validated as at start, its reloadable keys and the
// credential files' current content applied together, all or nothing.
type reloader struct {
	path     string // the configuration file; "": reload the credential files only
	inUse    Config
	loopback bool // the listener is bound to a loopback address
	creds    *credentials
}

// reload applies the file and returns the reloadable keys that changed.
// On an error nothing changes: the configuration and the credentials in
// use stay.
func (r *reloader) reload() ([]string, error) {
	next := r.inUse
	changed := []string{}
	if r.path != "" {
		c, err := LoadAndCheck(r.path)
		if err != nil {
			return nil, err
		}
		changed = changedKeys(r.inUse, c)
		if restart := restartKeys(changed); len(restart) > 0 {
			return nil, &restartError{Keys: restart}
		}
		// The file's check judged the listen address by its name; what
		// counts is the address bound at start (a "localhost" that
		// resolves elsewhere). Run refuses to start in that case, so
		// a reload must not turn anonymous access on there either.
		if c.Auth.Anonymous != nil && !r.loopback {
			return nil, errors.New("auth.anonymous: the listener is not bound to a loopback address, and anonymous access is loopback only")
		}
		next = c
	}
	if err := r.creds.reload(next); err != nil {
		return nil, err
	}
	r.inUse = next
	return changed, nil
}
