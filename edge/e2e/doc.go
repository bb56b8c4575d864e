// Package e2e holds end-to-end tests of the edge agent: real edged
// processes, built once per test binary, run on 127.0.0.1 with
// certificates from `edgectl pki`, operated with the edgectl binary and
// the RPC client. It has no non-test code.
package e2e
