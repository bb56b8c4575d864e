package relaycli

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/relay-dev/relay/infra/bolt"
	"github.com/relay-dev/relay/internal/relaybackup"
)

// BackupPath is the route of a running server that streams its backup
// (relaybackup.Handler, operate role).
const BackupPath = "/v1/admin/backup"

// backupCmd is `relay backup`: a consistent copy of a stopped relay's bbolt
// file, or of a running server's files through its backup route.
func backupCmd(stdout io.Writer) *cobra.Command {
	var (
		dbPath string
		sf     serverFlags
	)
	c := &cobra.Command{
		Use:   "backup (--db FILE OUT | --url URL OUTDIR)",
		Short: "Copy a relay's bbolt file consistently: a stopped file, or a running server's through its API",
		Long: `backup writes a consistent copy of a relay's bbolt files (docs/serve.md, "Backup
and restore"). Every copy is written under a temporary name, synced, checked with
bbolt's consistency check and only then renamed into place.

  --db FILE OUT     copy the file FILE to OUT (into OUT/FILE's name when OUT is
                    a directory). No process may hold FILE open: a
                    running relay serve locks it (bbolt is single-process), and
                    backup says so; back a running server up with --url instead.
  --url URL OUTDIR  ask the running server at URL (https://host:7480) for a backup:
                    one request, answered with snapshots of all its files taken at
                    one instant (relay.db, and targets.db when targets live in
                    their own file), written into the directory OUTDIR. Needs a
                    principal with the operate and read roles: --token-file (a
                    file holding the bearer token) or --cert/--key; --ca trusts
                    the server's CA. Only a server on bbolt files has
                    this backup: one on PostgreSQL or DynamoDB answers
                    501 not_supported, and backup exits non-zero saying
                    what to use instead (pg_dump or pg_basebackup with
                    WAL archiving; DynamoDB point-in-time recovery or
                    on-demand backups; docs/serve.md).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out := args[0]
			if err := sf.credentialsWithoutURL(); err != nil {
				return err
			}
			switch {
			case (dbPath == "") == (sf.url == ""):
				return usageErrorf("give one of --db FILE (a stopped relay's file) or --url URL (a running server)")
			case dbPath != "":
				// As cp does: into an existing directory, under the
				// file's own name (the name a restore puts back).
				if st, err := os.Stat(out); err == nil && st.IsDir() {
					out = filepath.Join(out, filepath.Base(dbPath))
				}
				if err := relaybackup.WriteFile(out, func(w io.Writer) (int64, error) { return bolt.CopyFile(dbPath, w, 0) }); err != nil {
					if errors.Is(err, bolt.ErrLocked) {
						return &lockedError{fmt.Errorf("%w: a running relay serve holds it; back it up through the server: relay backup --url https://HOST:PORT --token-file FILE OUTDIR", err)}
					}
					return err
				}
				fmt.Fprintln(stdout, "relay backup: wrote", out)
				return nil
			}
			srv, err := sf.dial()
			if err != nil {
				return err
			}
			req, err := srv.newRequest(cmd.Context(), http.MethodGet, BackupPath, "", nil)
			if err != nil {
				return err
			}
			if st, err := os.Stat(out); err != nil || !st.IsDir() {
				return fmt.Errorf("OUTDIR %s: not a directory (create it first)", out)
			}
			paths, err := relaybackup.Fetch(cmd.Context(), srv.client, req, out)
			for _, p := range paths {
				fmt.Fprintln(stdout, "relay backup: wrote", p)
			}
			if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok && !srv.hasCA {
				err = fmt.Errorf("%w: give --ca the CA certificate that signed the server's", err)
			}
			return err
		},
	}
	c.Flags().StringVar(&dbPath, "db", "", "bbolt file of a stopped relay")
	sf.register(c, "a principal with the operate and read roles")
	return c
}

// openBolt opens a relay's bbolt file for the commands that take --db.
// bbolt lets one process at a time hold a file and says only "timeout"
// when another does; the likely holder is a running relay serve, whose
// API reads and operates on the same data.
func openBolt(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, bolt.Options{})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, &lockedError{fmt.Errorf("%s is locked by another process, likely a running relay serve: stop it, or use its HTTP API "+
			"(relay targets, target and archive take --url, as does relay backup; docs/operations.md)", path)}
	}
	return db, err
}

// lockedError: the bbolt file is held by another process (code "locked"
// in a --json error: a script can go to the server with --url instead).
type lockedError struct{ error }

func (e *lockedError) Unwrap() error { return e.error }
