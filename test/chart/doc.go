// Package chart tests the Helm chart charts/weft as a whole: helm lint
// --strict, render goldens for the default and non-default values,
// structural checks of the rendered objects (resources, probes, security
// contexts, RBAC ownership, images, the webhook's PodDisruptionBudget), the
// CRDs in charts/weft/crds, values that values.schema.json must refuse, and
// the install notes.
//
// The tests run bin/helm (make tools) and skip without it. Rewrite the
// goldens in testdata with
//
//	go test ./test/chart -update
//
// The package lives outside charts/weft because helm would package
// anything inside the chart's directory.
package chart
