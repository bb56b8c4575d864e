// Package relaybackup takes and fetches online backups of a running
// relay's bbolt files, and writes backup files safely.
//
// A running `relay serve` holds its files locked (bbolt allows one
// process per file), so a backup of a running server is taken by the
// server itself: Handler answers GET with a tar stream of consistent
// snapshots of its files (bolt.Snapshots: all taken at one instant, so a
// source file and a separate targets file agree), and Fetch, on the
// client, unpacks such a stream into a directory, writing each file under
// a temporary name, syncing it, checking it with bbolt's consistency
// check and only then renaming it into place. A stopped server's file is
// copied with bolt.CopyFile and written with WriteFile. docs/serve.md
// ("Backup and restore") has the procedure.
package relaybackup

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/relay-dev/relay/infra/bolt"
)

// File is one bbolt file of the server and the name its copy gets in the
// backup ("relay.db", "targets.db").
type File struct {
	Name string
	DB   *bolt.DB
}

// Handler serves GET with a tar stream holding a consistent snapshot of
// each file, in order, with an exact Content-Length (a cut stream is a
// short read, never a short file taken for whole). Other methods get 405.
// Authorisation is the caller's business: mount it behind the operate
// role. The write deadline of the connection is lifted while the snapshot
// streams (a backup outlasts an API request), and the snapshot's read
// transactions are held until it is written.
func Handler(log *slog.Logger, files ...File) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("allow", "GET")
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" "+r.URL.Path+": use GET")
			return
		}
		dbs := make([]*bolt.DB, len(files))
		for i, f := range files {
			dbs[i] = f.DB
		}
		start := time.Now()
		snaps, err := bolt.Snapshots(dbs...)
		if err != nil {
			log.Error("backup: snapshot", "err", err)
			writeError(w, http.StatusInternalServerError, "internal", err.Error())
			return
		}
		defer func() {
			for _, s := range snaps {
				_ = s.Close()
			}
		}()
		var total int64 = 2 * tarBlock // the end-of-archive marker
		for _, s := range snaps {
			total += tarBlock + roundUp(s.Size())
		}
		_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
		w.Header().Set("content-type", "application/x-tar")
		w.Header().Set("content-length", strconv.FormatInt(total, 10))
		w.Header().Set("content-disposition", `attachment; filename="relay-backup.tar"`)
		// A drain that gives up cancels the request: stop writing, so the
		// snapshot's read transactions end and the files can close.
		tw := tar.NewWriter(ctxWriter{r.Context(), w})
		for i, s := range snaps {
			hdr := &tar.Header{Name: files[i].Name, Mode: 0o600, Size: s.Size(), ModTime: start, Format: tar.FormatUSTAR}
			if err := tw.WriteHeader(hdr); err != nil {
				log.Error("backup: write", "file", files[i].Name, "err", err)
				return
			}
			if _, err := s.WriteTo(tw); err != nil {
				log.Error("backup: write", "file", files[i].Name, "err", err)
				return
			}
		}
		if err := tw.Close(); err != nil {
			log.Error("backup: write", "err", err)
			return
		}
		log.Info("backup: sent", "files", len(files), "bytes", total, "ms", time.Since(start).Milliseconds())
	})
}

const tarBlock = 512

// ctxWriter fails writes once ctx is done.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

func roundUp(n int64) int64 { return (n + tarBlock - 1) / tarBlock * tarBlock }

func writeError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": message}})
}

// Fetch sends req (a GET of the backup route, with its credentials) and
// unpacks the answer into dir, which must exist: each file is written
// under a temporary name, synced, checked (bolt.CheckFile) and renamed
// into place, so dir never holds a partial or corrupt copy under a
// file's name. It returns the paths written. A non-200 answer is an
// error carrying the server's message.
func Fetch(ctx context.Context, client *http.Client, req *http.Request, dir string) ([]string, error) {
	resp, err := client.Do(req.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("fetch backup: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		// The server's error body, {"error":{"code","message"}}, is
		// shown as its message: on a database store (501
		// not_supported) that says which backups to use instead.
		var eb struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(msg, &eb) == nil && eb.Error.Message != "" {
			return nil, fmt.Errorf("fetch backup: %s: %s: %s", resp.Status, eb.Error.Code, eb.Error.Message)
		}
		return nil, fmt.Errorf("fetch backup: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	tr := tar.NewReader(resp.Body)
	var out []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return out, fmt.Errorf("fetch backup: %w", err)
		}
		name := hdr.Name
		if hdr.Typeflag != tar.TypeReg || name != filepath.Base(name) || name == "." || name == ".." {
			return out, fmt.Errorf("fetch backup: unexpected entry %q in the stream", name)
		}
		path := filepath.Join(dir, name)
		if err := WriteFile(path, func(w io.Writer) (int64, error) { return io.Copy(w, tr) }); err != nil {
			return out, fmt.Errorf("fetch backup: %w", err)
		}
		out = append(out, path)
	}
	if len(out) == 0 {
		return nil, errors.New("fetch backup: the stream holds no file")
	}
	return out, nil
}

// ErrHeld: the file a backup would replace is open in a running process
// (a relay serve's live file, say), so WriteFile leaves it alone.
var ErrHeld = errors.New("the file is held open by a running process (a relay serve's live file?)")

// WriteFile writes a bbolt file at path through write: into a temporary
// file in the same directory, synced, checked with bolt.CheckFile, then
// renamed over path and the directory synced. A path that a process holds
// open (its bbolt lock) is not replaced: ErrHeld. On any error path is
// left as it was and the temporary file is removed.
func WriteFile(path string, write func(io.Writer) (int64, error)) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err = write(f); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = bolt.CheckFile(tmp); err != nil {
		return fmt.Errorf("write %s: the copy fails the check: %w", path, err)
	}
	// A backup written into a running relay's own directory would
	// replace its live file: the process would go on writing to the
	// unlinked one, and its next start would open the snapshot and lose
	// everything since. (Checked just before the rename: a process that
	// opens the file in between is not caught.)
	held, err := heldOpen(path)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if held {
		return fmt.Errorf("write %s: %w: not replaced; write the backup somewhere else", path, ErrHeld)
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	if d, derr := os.Open(filepath.Dir(path)); derr == nil {
		err = d.Sync()
		d.Close()
	}
	return err
}
