// Package silenttest gives tests a service that hangs: a TCP listener on
// 127.0.0.1 that completes every handshake and never reads or answers, so
// a client's call waits until its own deadline, the way a stalled network,
// a frozen server or a peer down behind a proxy looks to it. Tests only.
package silenttest

import (
	"net"
	"sync"
	"testing"
)

// Addr starts such a listener and returns its host:port. It and every
// connection it accepted are closed when the test ends.
func Addr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}
