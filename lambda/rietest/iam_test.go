//go:build unix

package rietest

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

// grant is one IAM permission a request needs: function (SAM logical id),
// action and resource (a template logical id, or "<Table>/index/<name>").
type grant struct{ fn, action, resource string }

// tableIDs maps the rig's table names to template.yaml's logical ids.
var tableIDs = map[string]string{sourceTable: "SourceTable", targetTable: "TargetTable"}

// grantsFor derives the grants a DynamoDB request needs, following IAM's
// rules: GetItem, BatchGetItem and BatchWriteItem (per table) and Query are their own actions (a Query on an index is
// authorised on the index ARN), and TransactWriteItems has no action of
// its own: each item needs PutItem, DeleteItem, UpdateItem or
// ConditionCheckItem on its table.
func grantsFor(fn, op string, body []byte) []grant {
	var in struct {
		TableName     string
		IndexName     string
		TransactItems []map[string]struct{ TableName string }
		RequestItems  map[string]json.RawMessage
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return []grant{{fn, "dynamodb:" + op, "unparsable request"}}
	}
	res := func(table string) string {
		if id, ok := tableIDs[table]; ok {
			return id
		}
		return "unknown table " + table
	}
	switch op {
	case "TransactWriteItems":
		var out []grant
		for _, it := range in.TransactItems {
			for kind, x := range it {
				action := map[string]string{"Put": "PutItem", "Delete": "DeleteItem", "Update": "UpdateItem", "ConditionCheck": "ConditionCheckItem"}[kind]
				out = append(out, grant{fn, "dynamodb:" + action, res(x.TableName)})
			}
		}
		return out
	case "BatchGetItem", "BatchWriteItem":
		// Authorised per table named in RequestItems.
		var out []grant
		for table := range in.RequestItems {
			out = append(out, grant{fn, "dynamodb:" + op, res(table)})
		}
		return out
	case "Query", "Scan":
		if in.IndexName != "" {
			return []grant{{fn, "dynamodb:" + op, res(in.TableName) + "/index/" + in.IndexName}}
		}
	}
	return []grant{{fn, "dynamodb:" + op, res(in.TableName)}}
}

// templateGrants reads every function's DynamoDB grants from
// template.yaml's inline policies (!GetAtt X.Arn and !Sub
// "${X.Arn}/index/i" resources), once per package run.
var templateGrants = sync.OnceValues(func() (map[grant]bool, error) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "template.yaml"))
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("template.yaml: %w", err)
	}
	out := map[grant]bool{}
	resources := child(doc.Content[0], "Resources")
	for i := 0; resources != nil && i+1 < len(resources.Content); i += 2 {
		fn, res := resources.Content[i].Value, resources.Content[i+1]
		policies := child(child(res, "Properties"), "Policies")
		if policies == nil {
			continue
		}
		for _, p := range policies.Content {
			stmts := child(p, "Statement") // SAM function policies; roles nest theirs
			if stmts == nil {
				continue
			}
			for _, st := range stmts.Content {
				for _, a := range scalars(child(st, "Action")) {
					for _, r := range scalars(child(st, "Resource")) {
						out[grant{fn, a, r}] = true
					}
				}
			}
		}
	}
	return out, nil
})

func child(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// scalars lists a string-or-list node, rendering !GetAtt X.Arn as X and
// !Sub "${X.Arn}/rest" as X/rest.
func scalars(n *yaml.Node) []string {
	if n == nil {
		return nil
	}
	if n.Kind == yaml.SequenceNode {
		var out []string
		for _, c := range n.Content {
			out = append(out, scalars(c)...)
		}
		return out
	}
	v := n.Value
	switch n.Tag {
	case "!GetAtt":
		v = strings.TrimSuffix(v, ".Arn")
	case "!Sub":
		if rest, ok := strings.CutPrefix(v, "${"); ok {
			if name, tail, ok := strings.Cut(rest, ".Arn}"); ok {
				v = name + tail
			}
		}
	}
	return []string{v}
}

// templateFireARN is the fire function's ARN as template.yaml spells it
// (built from its FunctionName); env.json's FIRE_FUNCTION_ARN stands for it.
const templateFireARN = "arn:${AWS::Partition}:lambda:${AWS::Region}:${AWS::AccountId}:function:${AWS::StackName}-fire"

// forgetUnknownTables drops the recorded calls on tables the template
// does not define, for a test that names one on purpose.
func (r *rig) forgetUnknownTables() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for g := range r.calls {
		if strings.HasPrefix(g.resource, "unknown table ") {
			delete(r.calls, g)
		}
	}
}

// checkGrants fails the test if a function made a DynamoDB request or a
// Lambda invoke that template.yaml does not grant it: the request would be
// denied in AWS.
func (r *rig) checkGrants() {
	granted, err := templateGrants()
	if err != nil {
		r.t.Errorf("read template grants: %v", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	calls := maps.Clone(r.calls)
	for fn, s := range r.lam {
		// invoketest accepts only the fire function's ARN, so every
		// accepted invoke is lambda:InvokeFunction on the fire function.
		if len(s.Accepted()) > 0 {
			calls[grant{fn, "lambda:InvokeFunction", templateFireARN}] = true
		}
	}
	var missing []string
	for g := range calls {
		if !granted[g] {
			missing = append(missing, fmt.Sprintf("%s: %s on %s", g.fn, g.action, g.resource))
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		r.t.Errorf("template.yaml does not grant what the function used (AccessDenied in AWS): %s", m)
	}
}
