// Package deploy holds no code, only the tests that keep the serverless
// deployment honest: template.yaml (SAM), sam.mk (the build targets `sam
// build` runs), samconfig.toml, env.json and the events/ payloads used by
// `sam local invoke`.
//
// Schema validity is cfn-lint's job (with the SAM translator, what `sam
// validate --lint` runs; informational checks on, zero findings): the tests
// run it when it is installed and skip that part with a message when it is
// not, unless RELAY_REQUIRE_CFN_LINT is set, as in CI. On the parsed YAML
// they check the project's own rules: every function has one build target
// and a main package; IAM grants no wildcard and only the reviewed
// action/resource pairs; the scheduler role can only invoke the fire
// function; every explicit name comes from the stack name or TablePrefix
// (two stacks can share an account and region) and fits its service's
// limit up to the documented 57-character stack name; asynchronous
// failures reach the dead-letter queue, which an alarm watches; log groups
// belong to the stack; the table layout matches docs/dynamodb.md; the
// sample events are the shapes the functions decode; and no binary under
// cmd/ or functions/ links test code (testing, net/http/httptest) or, but
// relay, the DynamoDB emulator (TestDeps).
package deploy
