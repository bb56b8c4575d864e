package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/relay-dev/relay/edge/config"
	"github.com/relay-dev/relay/edge/pki/pkitest"
	"github.com/relay-dev/relay/edge/rpc"
)

// TestIngestByPathDisabledByDefault: without rpc.ingest_dirs a local
// client cannot make edged read a file, not even edged's own TLS key, and
// the refusal names the key to set. Uploads keep working.
func TestIngestByPathDisabledByDefault(t *testing.T) {
	dir := pkitest.New(t, "a")
	n := startCluster(t, dir, []string{"a"}, nil)["a"]
	ctx := context.Background()
	_, err := n.client.PutPath(ctx, n.cfg.TLS.Key, "stolen-key")
	var re *rpc.Error
	if !errors.As(err, &re) || re.Status != 403 || !strings.Contains(re.Message, "rpc.ingest_dirs") {
		t.Fatalf("by-path ingest of the TLS key without ingest dirs: %v; want 403 naming rpc.ingest_dirs", err)
	}
	put(t, n, "uploaded", []byte("streamed bytes still work"))
	if ix, _ := n.client.Index(ctx); len(ix.Segments) != 1 || ix.Segments[0].ID != "uploaded" {
		t.Fatalf("index %+v, want only the upload", ix.Segments)
	}
}

// TestIngestByPathConfined: with rpc.ingest_dirs set, only regular files
// that resolve inside those directories are read.
func TestIngestByPathConfined(t *testing.T) {
	dir := pkitest.New(t, "a")
	base := t.TempDir()
	ingest := filepath.Join(base, "ingest")
	elsewhere := filepath.Join(base, "elsewhere")
	for _, d := range []string{ingest, filepath.Join(ingest, "sub"), elsewhere} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, content string) {
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(ingest, "ok.bin"), "inside")
	write(filepath.Join(ingest, "sub", "deep.bin"), "deeper")
	write(filepath.Join(elsewhere, "secret"), "outside")
	symlink := func(target, link string) {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	symlink(filepath.Join(elsewhere, "secret"), filepath.Join(ingest, "escape")) // inside, pointing out
	symlink(filepath.Join(ingest, "ok.bin"), filepath.Join(elsewhere, "way-in")) // outside, pointing in
	symlink(elsewhere, filepath.Join(ingest, "dir-escape"))                      // a directory link out
	symlink(filepath.Join(ingest, "sub"), filepath.Join(elsewhere, "sub-link"))  // a directory link in
	if err := syscall.Mkfifo(filepath.Join(ingest, "fifo"), 0o600); err != nil { // would block a reader
		t.Fatal(err)
	}
	// The ingest dir is named through a symlink in the config: resolved too.
	symlink(ingest, filepath.Join(base, "ingest-link"))

	relayLn, rpcLn := listen(t), listen(t)
	cfg := nodeConfig(t, dir, "a", relayLn.Addr().String(), rpcLn.Addr().String(), nil)
	cfg.RPC.IngestDirs = []string{filepath.Join(base, "ingest-link"), filepath.Join(base, "missing-dir")}
	n := startNode(t, cfg, relayLn, rpcLn)
	ctx := context.Background()

	for _, tc := range []struct {
		name, path, id string
		status         int // 0: stored
	}{
		{"file inside", filepath.Join(ingest, "ok.bin"), "ok", 0},
		{"file in a subdirectory", filepath.Join(ingest, "sub", "deep.bin"), "deep", 0},
		{"symlink from outside into the dir", filepath.Join(elsewhere, "way-in"), "way-in", 0},
		{"directory symlink into the dir", filepath.Join(elsewhere, "sub-link", "deep.bin"), "deep-2", 0},
		{"file outside", filepath.Join(elsewhere, "secret"), "x1", 403},
		{"edged's TLS key", cfg.TLS.Key, "x2", 403},
		{"edged's database", filepath.Join(cfg.Storage.Dir, DBFile), "x3", 403},
		{"dot-dot out of the dir", filepath.Join(ingest, "..", "elsewhere", "secret"), "x4", 403},
		{"symlink inside pointing out", filepath.Join(ingest, "escape"), "x5", 403},
		{"through a directory symlink out", filepath.Join(ingest, "dir-escape", "secret"), "x6", 403},
		{"the ingest dir itself", ingest, "x7", 403},
		{"a fifo inside", filepath.Join(ingest, "fifo"), "x8", 403},
		{"missing file inside", filepath.Join(ingest, "nope"), "x9", 404},
		{"missing file outside", filepath.Join(elsewhere, "nope"), "x10", 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, err := n.client.PutPath(ctx, tc.path, tc.id)
			if tc.status == 0 {
				if err != nil || in.Segment.ID != tc.id {
					t.Fatalf("PutPath(%s) = %+v, %v; want stored", tc.path, in, err)
				}
				return
			}
			var re *rpc.Error
			if !errors.As(err, &re) || re.Status != tc.status {
				t.Fatalf("PutPath(%s) = %+v, %v; want HTTP %d", tc.path, in, err, tc.status)
			}
		})
	}
	ix, err := n.client.Index(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range ix.Segments {
		ids = append(ids, s.ID)
	}
	if strings.Join(ids, ",") != "deep,deep-2,ok,way-in" {
		t.Fatalf("stored %v; want only the four files inside the ingest dir", ids)
	}
}

// TestIngestDirsConfig: rpc.ingest_dirs is resolved against the config
// file's directory and refuses empty entries.
func TestIngestDirsConfig(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "edged.yaml")
	doc := "node_id: a\ntls: {cert: a.crt, key: a.key, ca: ca.crt}\nstorage: {dir: data}\nrpc:\n  ingest_dirs: [spool, /abs/spool]\n"
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.RPC.IngestDirs, ","); got != filepath.Join(dir, "spool")+",/abs/spool" {
		t.Fatalf("ingest dirs %s", got)
	}
	_, err = config.Parse([]byte("node_id: a\ntls: {cert: a, key: b, ca: c}\nstorage: {dir: d}\nrpc: {ingest_dirs: [\"\"]}\n"))
	if err == nil || !strings.Contains(err.Error(), "rpc.ingest_dirs[0]") {
		t.Fatalf("empty ingest dir: %v", err)
	}
}

// TestUploadEmptyFile: a 0-byte segment is legal (docs/wire.md), and
// edgectl segment put streams it from its *os.File as any other. The
// client used to set ContentLength 0 on that non-nil body, which Go's
// transport sends chunked, and edged refused it "Content-Length
// required" (HTTP 400).
func TestUploadEmptyFile(t *testing.T) {
	dir := pkitest.New(t, "a")
	n := startCluster(t, dir, []string{"a"}, nil)["a"]
	path := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	in, err := n.client.PutSegment(context.Background(), "empty", 0, empty, f)
	if err != nil {
		t.Fatalf("upload of an empty file: %v", err)
	}
	if in.Segment.Size != 0 || in.Segment.SHA256 != empty {
		t.Fatalf("stored %+v, want 0 bytes, sha256 %s", in.Segment, empty)
	}
	if !stored(n, "empty") {
		t.Fatal("empty segment not in the index")
	}
}
