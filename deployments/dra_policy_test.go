package deployments_test

import (
	"encoding/json"
	"testing"

	"github.com/google/cel-go/cel"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
)

// evalPolicy evaluates p's match conditions, variables and validations the
// way the API server's ValidatingAdmissionPolicy plugin does for a request
// (object, oldObject, request.userInfo), with CEL's optional types as
// Kubernetes enables them. It returns the messages of the validations that
// fail; nil when the request is admitted or the policy does not match.
// The objects are untyped (JSON as the API server decodes it), which is
// also how the API server evaluates them when type checking has no schema.
func evalPolicy(t *testing.T, p *admissionv1.ValidatingAdmissionPolicy, request, object, oldObject map[string]any) []string {
	t.Helper()
	env, err := cel.NewEnv(cel.OptionalTypes(),
		cel.Variable("request", cel.DynType), cel.Variable("object", cel.DynType),
		cel.Variable("oldObject", cel.DynType), cel.Variable("variables", cel.DynType))
	require.NoError(t, err)
	vars := map[string]any{}
	activation := map[string]any{"request": request, "object": object, "oldObject": oldObject, "variables": vars}
	eval := func(expr string) any {
		ast, iss := env.Compile(expr)
		require.NoError(t, iss.Err(), "compile %q", expr)
		prg, err := env.Program(ast)
		require.NoError(t, err)
		out, _, err := prg.Eval(activation)
		require.NoError(t, err, "evaluate %q", expr)
		return out.Value()
	}
	for _, mc := range p.Spec.MatchConditions {
		if eval(mc.Expression) != true {
			return nil
		}
	}
	for _, v := range p.Spec.Variables {
		vars[v.Name] = eval(v.Expression)
	}
	var failed []string
	for _, v := range p.Spec.Validations {
		if eval(v.Expression) != true {
			msg := v.Message
			if v.MessageExpression != "" {
				msg = eval(v.MessageExpression).(string)
			}
			failed = append(failed, msg)
		}
	}
	return failed
}

// asJSON turns a JSON literal into what the API server's CEL sees.
func asJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(s), &m))
	return m
}

// Finding 5 of issue 44: the plugin's status writes are limited to its own
// driver's entries of claims allocated to its own node, also where the API
// server's granular status authorization is off. The first case is the
// driver's own write (claimstatus.go: a server-side apply of its devices'
// networkData), which the policy must let through.
func TestDRAClaimStatusPolicy(t *testing.T) {
	m := renderWith(t, "components/dra")
	var p *admissionv1.ValidatingAdmissionPolicy
	for _, ap := range m.admissionPolicies {
		if ap.Name == "fastpath-rdma-dra-resourceclaims" {
			p = ap
		}
	}
	require.NotNil(t, p, "the ResourceClaim status policy")
	rules := p.Spec.MatchConstraints.ResourceRules
	require.Len(t, rules, 1)
	require.Equal(t, []string{"resourceclaims/status"}, []string(rules[0].Resources))
	require.Equal(t, []admissionv1.OperationType{admissionv1.Update}, rules[0].Operations)
	require.Equal(t, admissionv1.Fail, *p.Spec.FailurePolicy)
	bound := false
	for _, b := range m.policyBindings {
		bound = bound || (b.Spec.PolicyName == p.Name && len(b.Spec.ValidationActions) == 1 && b.Spec.ValidationActions[0] == admissionv1.Deny)
	}
	require.True(t, bound, "a binding that denies")

	const allocated = `"allocation": {"devices": {"results": [
	    {"request": "vf", "driver": "rdma.fastpath-k8s.io", "pool": "node-a", "device": "vf-0000-3b-00-2"},
	    {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"}]},
	  "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}},
	  "reservedFor": [{"resource": "pods", "name": "train", "uid": "u1"}]`
	const gpuEntry = `{"driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0", "conditions": []}`
	const ourEntry = `{"driver": "rdma.fastpath-k8s.io", "pool": "node-a", "device": "vf-0000-3b-00-2", "networkData": {"interfaceName": "net1", "ips": ["10.56.217.2/24"]}}`
	claim := func(status string) map[string]any {
		return asJSON(t, `{"metadata": {"name": "c", "namespace": "default"}, "status": {`+status+`}}`)
	}
	user := func(name string, node ...string) map[string]any {
		// The API server's request.userInfo always has extra (a typed
		// map), empty for a token not bound to a pod.
		u := map[string]any{"username": name, "extra": map[string]any{}}
		if len(node) > 0 {
			u["extra"] = map[string]any{"authentication.kubernetes.io/node-name": []any{node[0]}}
		}
		return map[string]any{"userInfo": u}
	}
	plugin := user(draSA, "node-a")
	old := claim(allocated + `, "devices": [` + gpuEntry + `]`)
	for _, tc := range []struct {
		name     string
		request  map[string]any
		old, new map[string]any
		refused  string // a message of a failing validation; "" admitted
	}{
		{"the driver's own write: its entries, its node", plugin, old, claim(allocated + `, "devices": [` + gpuEntry + `, ` + ourEntry + `]`), ""},
		{"the driver's first entry, no other driver's", plugin, claim(allocated), claim(allocated + `, "devices": [` + ourEntry + `]`), ""},
		{"another service account is not this policy's", user("system:serviceaccount:kube-system:other", "node-b"), old, claim(allocated), ""},
		{"a token not bound to a pod", user(draSA), old, claim(allocated + `, "devices": [` + gpuEntry + `, ` + ourEntry + `]`), "the plugin's token names no node (is the service account token bound to the pod?)"},
		{"a claim of another node", user(draSA, "node-b"), old, claim(allocated + `, "devices": [` + gpuEntry + `, ` + ourEntry + `]`), "the plugin on node node-b may only write the status of claims allocated to that node"},
		{"an unallocated claim", plugin, claim(``), claim(`"devices": [` + ourEntry + `]`), "the plugin on node node-a may only write the status of claims allocated to that node"},
		{"another driver's entry changed", plugin, old, claim(allocated + `, "devices": [` + `{"driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0", "conditions": [], "data": {"x": 1}}` + `]`), "fastpath's plugin may only change the status.devices entries of driver rdma.fastpath-k8s.io"},
		{"another driver's entry removed", plugin, old, claim(allocated + `, "devices": [` + ourEntry + `]`), "fastpath's plugin may only change the status.devices entries of driver rdma.fastpath-k8s.io"},
		{"another driver's entry added", plugin, claim(allocated), claim(allocated + `, "devices": [` + gpuEntry + `]`), "fastpath's plugin may only change the status.devices entries of driver rdma.fastpath-k8s.io"},
		{"the allocation dropped", plugin, old, claim(`"devices": [` + gpuEntry + `]`), "the plugin on node node-a may only write the status of claims allocated to that node"},
		{"reservedFor changed", plugin, old, claim(allocated[:len(allocated)-len(`"reservedFor": [{"resource": "pods", "name": "train", "uid": "u1"}]`)] + `"reservedFor": [], "devices": [` + gpuEntry + `]`), "fastpath's plugin may not change a claim's allocation or reservedFor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failed := evalPolicy(t, p, tc.request, tc.new, tc.old)
			if tc.refused == "" {
				require.Empty(t, failed)
				return
			}
			require.Contains(t, failed, tc.refused)
		})
	}
}
