package relayserve

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// configLeaf is a key of Config the file can set, and the field holding it.
type configLeaf struct {
	key   string
	index []int
}

// configLeaves lists every key of Config by its yaml tags, down to the
// values changedKeys compares whole or per map key: a field added to
// Config, at any depth, is listed without the test changing. Each field
// must carry a yaml tag: the key in the file is what the operator reads
// in the refusal log and in docs/serve.md.
func configLeaves(t *testing.T) []configLeaf {
	t.Helper()
	var out []configLeaf
	var walk func(prefix string, index []int, typ reflect.Type)
	walk = func(prefix string, index []int, typ reflect.Type) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if tag == "" || tag == "-" {
				t.Errorf("%s.%s has no yaml key: give it one (and a place in docs/serve.md)", typ.Name(), f.Name)
				continue
			}
			key := tag
			if prefix != "" {
				key = prefix + "." + tag
			}
			idx := append(index[:len(index):len(index)], i)
			if f.Type.Kind() == reflect.Struct && f.Type.PkgPath() == configPkg {
				walk(key, idx, f.Type)
				continue
			}
			out = append(out, configLeaf{key, idx})
		}
	}
	walk("", nil, reflect.TypeFor[Config]())
	return out
}

// sampleConfig has every optional part set, so each key has a value to
// change.
func sampleConfig() Config {
	c := Default()
	c.DB = "/var/lib/relay/relay.db"
	c.Targets.DB = "/var/lib/relay/targets.db"
	c.TLS = TLS{Cert: "server.crt", Key: "server.key", ClientCA: "ca.crt"}
	c.Auth = Auth{TokensFile: "tokens", Anonymous: &Roles{Read: true}}
	c.Principals = map[string]Roles{"orders-app": {Produce: []string{"orders"}}, "ops": {Read: true, Operate: true}}
	return c
}

// changed returns v with a different value of its kind, or false when
// the test does not know how to change that kind.
func changed(v reflect.Value) (reflect.Value, bool) {
	n := reflect.New(v.Type()).Elem()
	switch v.Kind() {
	case reflect.String:
		n.SetString(v.String() + "-changed")
	case reflect.Bool:
		n.SetBool(!v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64: // time.Duration too
		n.SetInt(v.Int() + 1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n.SetUint(v.Uint() + 1)
	case reflect.Float32, reflect.Float64:
		n.SetFloat(v.Float() + 1)
	case reflect.Pointer:
		if v.IsNil() {
			n.Set(reflect.New(v.Type().Elem()))
		} // else n stays nil
	case reflect.Slice:
		n = reflect.Append(reflect.AppendSlice(n, v), reflect.New(v.Type().Elem()).Elem())
	case reflect.Map:
		n.Set(reflect.MakeMap(v.Type()))
		for it := v.MapRange(); it.Next(); {
			n.SetMapIndex(it.Key(), it.Value())
		}
		k, ok := changed(reflect.New(v.Type().Key()).Elem())
		if !ok {
			return n, false
		}
		n.SetMapIndex(k, reflect.New(v.Type().Elem()).Elem())
	default:
		return n, false
	}
	return n, true
}

// Every key of Config, at every depth, is compared: changing it alone is
// reported under its YAML path, and the reload is refused for it unless
// it is declared reloadable. A field of a kind the test cannot change
// fails the test, so a new field is never silently left out.
func TestChangedKeysCoversEveryKey(t *testing.T) {
	leaves := configLeaves(t)
	if len(leaves) < 25 {
		t.Fatalf("only %d keys found in Config: the walk is broken", len(leaves))
	}
	var reloadableSeen []string
	for _, l := range leaves {
		t.Run(l.key, func(t *testing.T) {
			base := sampleConfig()
			next := sampleConfig()
			field := reflect.ValueOf(&next).Elem().FieldByIndex(l.index)
			v, ok := changed(field)
			if !ok {
				t.Fatalf("%s is a %v, which this test cannot change: teach changed (and check changedKeys compares it)", l.key, field.Type())
			}
			field.Set(v)
			got := changedKeys(base, next)
			if len(got) == 0 {
				t.Fatalf("a change to %s is not detected", l.key)
			}
			for _, k := range got {
				if k != l.key && !strings.HasPrefix(k, l.key+".") {
					t.Errorf("a change to %s is reported as %s", l.key, k)
				}
			}
			restart := restartKeys(got)
			if reloadable(l.key) {
				reloadableSeen = append(reloadableSeen, l.key)
				if len(restart) != 0 {
					t.Errorf("reloadable %s needs a restart: %v", l.key, restart)
				}
			} else if !slices.Equal(restart, []string{l.key}) {
				t.Errorf("restart keys %v; want [%s]", restart, l.key)
			}
		})
	}
	// The declared reloadable keys exist: a rename must not leave one
	// behind that matches nothing.
	slices.Sort(reloadableSeen)
	if declared := slices.Sorted(slices.Values(reloadableKeys)); !slices.Equal(reloadableSeen, declared) {
		t.Errorf("reloadable keys found in Config %v; declared %v", reloadableSeen, declared)
	}
}

func TestChangedKeys(t *testing.T) {
	edit := func(f func(*Config)) Config {
		c := sampleConfig()
		c.Principals = map[string]Roles{"orders-app": {Produce: []string{"orders"}}, "ops": {Read: true, Operate: true}}
		f(&c)
		return c
	}
	for _, tc := range []struct {
		name          string
		next          Config
		want, restart []string
	}{
		{"same", sampleConfig(), []string{}, nil},
		{"role granted", edit(func(c *Config) { c.Principals["orders-app"] = Roles{Produce: []string{"orders"}, Read: true} }),
			[]string{"principals.orders-app.read"}, nil},
		{"produce list", edit(func(c *Config) { c.Principals["orders-app"] = Roles{Produce: []string{"orders", "invoices"}} }),
			[]string{"principals.orders-app.produce"}, nil},
		{"absent and empty lists are the same", edit(func(c *Config) { c.Principals["ops"] = Roles{Produce: []string{}, Read: true, Operate: true} }),
			[]string{}, nil},
		{"principal added and removed", edit(func(c *Config) { delete(c.Principals, "ops"); c.Principals["dash"] = Roles{Read: true} }),
			[]string{"principals.dash", "principals.ops"}, nil},
		{"anonymous off", edit(func(c *Config) { c.Auth.Anonymous = nil }), []string{"auth.anonymous"}, nil},
		{"anonymous roles", edit(func(c *Config) { c.Auth.Anonymous = &Roles{Operate: true} }),
			[]string{"auth.anonymous.operate", "auth.anonymous.read"}, nil},
		{"restart keys with a role", edit(func(c *Config) {
			c.Listen = "127.0.0.1:1"
			c.Limits.MaxBodyBytes++
			c.TLS.ClientCA = ""
			c.Principals["ops"] = Roles{}
		}), []string{"limits.max_body_bytes", "listen", "principals.ops.operate", "principals.ops.read", "tls.client_ca"},
			[]string{"limits.max_body_bytes", "listen", "tls.client_ca"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := changedKeys(sampleConfig(), tc.next)
			if !slices.Equal(got, tc.want) {
				t.Errorf("changed %q; want %q", got, tc.want)
			}
			if r := restartKeys(got); !slices.Equal(r, tc.restart) {
				t.Errorf("restart %q; want %q", r, tc.restart)
			}
		})
	}
}

// reloadFixture is a configuration file with a tokens file next to it,
// loaded as the server's start would.
func reloadFixture(t *testing.T, principals string) (path string, cfg Config, creds *credentials) {
	t.Helper()
	dir := t.TempDir()
	_, line, err := MintToken("app")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens"), []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(dir, "relay.yaml")
	writeFile(t, path, "listen: 127.0.0.1:0\ndb: relay.db\nauth: {tokens_file: tokens}\n"+principals)
	cfg, err = LoadAndCheck(path)
	if err != nil {
		t.Fatal(err)
	}
	creds, err = loadCredentials(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return path, cfg, creds
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Anonymous access is loopback only, by the listen address's name at
// load and by the address bound at start: a reload cannot turn it on for
// a listener bound elsewhere (a "localhost" resolving to another
// address), though the file passes validation.
func TestReloadAnonymousNeedsLoopbackListener(t *testing.T) {
	path, cfg, creds := reloadFixture(t, "principals: {app: {read: true}}\n")
	inUse := creds.auth.Load()
	r := &reloader{path: path, inUse: cfg, loopback: false, creds: creds}
	writeFile(t, path, "listen: 127.0.0.1:0\ndb: relay.db\nauth: {tokens_file: tokens, anonymous: {read: true}}\nprincipals: {app: {read: true}}\n")
	if _, err := r.reload(); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("anonymous access turned on for a non-loopback listener: %v", err)
	}
	if creds.auth.Load() != inUse || r.inUse.Auth.Anonymous != nil {
		t.Fatal("a refused reload changed the credentials or the configuration in use")
	}
	r.loopback = true
	changed, err := r.reload()
	if err != nil || !slices.Equal(changed, []string{"auth.anonymous"}) {
		t.Fatalf("on loopback: changed %v, %v", changed, err)
	}
	if creds.auth.Load().anonymous == nil {
		t.Fatal("anonymous access not applied")
	}
}

// A file that fails validation or changes a key read at start changes
// nothing; an embedder's server (no file) reloads the credential files
// with the configuration it was given.
func TestReloadRefusalsChangeNothing(t *testing.T) {
	path, cfg, creds := reloadFixture(t, "principals: {app: {read: true}}\n")
	inUse := creds.auth.Load()
	r := &reloader{path: path, inUse: cfg, loopback: true, creds: creds}
	for _, tc := range []struct{ name, yaml, want string }{
		{"invalid", "listen: 127.0.0.1:0\ndb: relay.db\nauth: {tokens_file: tokens}\nprincipals: {app: {read: yes please}}\n", "principals.app.read"},
		{"restart key", "listen: 127.0.0.1:0\ndb: relay.db\nauth: {tokens_file: tokens}\nprincipals: {app: {read: true, operate: true}}\ndrain_timeout: 1s\n",
			"drain_timeout changed"},
		{"missing file", "", "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.yaml == "" {
				os.Remove(path)
			} else {
				writeFile(t, path, tc.yaml)
			}
			if _, err := r.reload(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v; want one saying %q", err, tc.want)
			}
			if creds.auth.Load() != inUse || !reflect.DeepEqual(r.inUse, cfg) {
				t.Fatal("a refused reload changed the credentials or the configuration in use")
			}
		})
	}

	embedded := &reloader{inUse: cfg, loopback: true, creds: creds}
	changed, err := embedded.reload()
	if err != nil || len(changed) != 0 || creds.auth.Load() == inUse {
		t.Fatalf("reload without a file: changed %v, %v, swapped %v", changed, err, creds.auth.Load() != inUse)
	}
}
