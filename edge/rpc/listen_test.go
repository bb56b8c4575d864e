package rpc

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
)

func TestListenRefusesPublicAddresses(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.1:0", "example.com:0"} {
		if ln, err := Listen(addr); err == nil {
			ln.Close()
			t.Errorf("Listen(%q) accepted a non-loopback address", addr)
		} else if !errors.Is(err, ErrNotLocal) {
			t.Errorf("Listen(%q): %v, want ErrNotLocal", addr, err)
		}
	}
	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
}

func TestListenUnixSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "rpc.sock")
	ln, err := Listen("unix:" + sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode: %v, %v", fi.Mode(), err)
	}
	// A live socket is not stolen.
	if ln2, err := Listen("unix:" + sock); err == nil {
		ln2.Close()
		t.Fatal("second Listen on a live socket succeeded")
	}
	// A stale one (left by a crash) is replaced.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	ln, err = Listen("unix:" + sock)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	ln.Close()
	// A regular file at the path is never removed.
	file := filepath.Join(dir, "not-a-socket")
	os.WriteFile(file, []byte("keep"), 0o600)
	if ln, err := Listen("unix:" + file); err == nil {
		ln.Close()
		t.Fatal("Listen replaced a regular file")
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Fatal("regular file changed")
	}
}
