package postgres_test

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/relay-dev/relay/infra/postgres"
	"github.com/relay-dev/relay/infra/postgres/pgtest"
)

var roleSeq atomic.Int64

// TestVerify: Verify accepts what Open can run on and names what it
// cannot (a role's missing privileges, a newer schema), writing nothing.
func TestVerify(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	owner := pgtest.Pool(t, dsn, 2)
	role := func(t *testing.T, grants ...string) string {
		t.Helper()
		name := fmt.Sprintf("verify_role_%d", roleSeq.Add(1))
		pgtest.Admin(t, "CREATE ROLE "+name+" LOGIN")
		for _, g := range grants {
			if _, err := owner.Exec(t.Context(), fmt.Sprintf(g, name)); err != nil {
				t.Fatal(err)
			}
		}
		return name
	}
	as := func(t *testing.T, user string) error {
		t.Helper()
		return postgres.Verify(t.Context(), pgtest.Pool(t, strings.Replace(dsn, "user=relay", "user="+user, 1), 1))
	}

	if err := postgres.Verify(t.Context(), owner); err != nil {
		t.Fatalf("the owner on a new database: %v", err)
	}
	if err := as(t, role(t)); !errors.Is(err, postgres.ErrPermission) || !strings.Contains(err.Error(), "CREATE on schema public") {
		t.Fatalf("a role without CREATE on a new database: %v", err)
	}
	if got := tables(t, owner); got != "" {
		t.Fatalf("Verify wrote %q", got)
	}
	if _, err := postgres.Open(t.Context(), owner, postgres.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		grants []string
		want   string // "" = accepted
	}{
		{"no privileges", nil, "lacks SELECT on relay_items, INSERT on relay_items, UPDATE on relay_items, DELETE on relay_items, SELECT on relay_schema"},
		{"no delete", []string{"GRANT SELECT, INSERT, UPDATE ON relay_items TO %s", "GRANT SELECT ON relay_schema TO %s"}, "lacks DELETE on relay_items"},
		{"run-time privileges", []string{"GRANT SELECT, INSERT, UPDATE, DELETE ON relay_items TO %s", "GRANT SELECT ON relay_schema TO %s"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := as(t, role(t, tc.grants...))
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (!errors.Is(err, postgres.ErrPermission) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("%v; want ErrPermission naming %q", err, tc.want)
			}
		})
	}
	if _, err := owner.Exec(t.Context(), `INSERT INTO relay_schema (version, description) VALUES (2, 'from the future')`); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Verify(t.Context(), owner); !errors.Is(err, postgres.ErrSchemaTooNew) {
		t.Fatalf("a newer schema: %v", err)
	}
}

// TestVerifyNamesSchemaWithoutUsage: a search_path schema the role may not
// use is named as such, not reported missing (current_schema() skips both
// kinds the same way).
func TestVerifyNamesSchemaWithoutUsage(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	owner := pgtest.Pool(t, dsn, 1)
	if _, err := owner.Exec(t.Context(), `CREATE SCHEMA relayapp`); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("verify_role_%d", roleSeq.Add(1))
	pgtest.Admin(t, "CREATE ROLE "+name+" LOGIN")
	pool := pgtest.Pool(t, strings.Replace(dsn, "user=relay", "user="+name, 1)+" search_path=relayapp", 1)
	err := postgres.Verify(t.Context(), pool)
	if !errors.Is(err, postgres.ErrPermission) || !strings.Contains(err.Error(), "lacks USAGE on schema relayapp") {
		t.Fatalf("a role without USAGE on its search_path schema: %v", err)
	}
	pool = pgtest.Pool(t, strings.Replace(dsn, "user=relay", "user="+name, 1)+" search_path=nosuch", 1)
	if err := postgres.Verify(t.Context(), pool); !errors.Is(err, postgres.ErrPermission) || !strings.Contains(err.Error(), "no schema of the search_path exists") {
		t.Fatalf("a search_path schema that does not exist: %v", err)
	}
}
