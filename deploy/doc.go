// Package deploy holds no code, only the tests that keep the serverless
// deployment honest: template.yaml (SAM), sam.mk (the build targets `sam
// build` runs), samconfig.toml, env.json and the events/ payloads used by
// `sam local invoke`. Neither SAM CLI nor cfn-lint is available where the
// tests run, so they check what SAM and CloudFormation would depend on:
// that every function has a build target and a package, that IAM grants no
// wildcard actions or resources, that the scheduler role can only invoke the
// fire function, that the table layout matches docs/dynamodb.md, and that
// the sample events are the shapes the functions decode.
package deploy
