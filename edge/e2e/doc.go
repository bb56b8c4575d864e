// Package e2e holds end-to-end tests of the edge agent: real edged
// processes, built once per test binary, run on 127.0.0.1 with
// certificates from `edgectl pki`, operated with the edgectl binary and
// the RPC client. It has no non-test code. A second edged is built with
// -tags faultinject for the nodes whose segment writes a test makes fail
// on demand (edge/segstore/faultinject.go); every other node runs the
// production build.
package e2e
