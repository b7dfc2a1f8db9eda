// Package lambda holds what the Lambda front doors ship with: the default policy,
// lambda/policy.yaml, embedded so that a binary runs from any directory.
package lambda

import _ "embed"

//go:embed policy.yaml
var policyYAML []byte

// DefaultPolicyName is how the embedded default policy is named in logs and errors.
const DefaultPolicyName = "built-in lambda/policy.yaml"

// DefaultPolicy returns a copy of lambda/policy.yaml as it was when the binary was
// built.
func DefaultPolicy() []byte { return append([]byte(nil), policyYAML...) }
