#!/usr/bin/env bash
# lint.sh: gofmt, go vet and staticcheck (pinned in tools/lint) over the
# module, and govulncheck against the Go vulnerability database pinned in
# tools/vuln (its data is a module, indexed here: no network but the module
# proxy).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
BIN=$PWD/bin
mkdir -p "$BIN"

version=$(awk '$1 == "honnef.co/go/tools" {print $2} $1 == "require" && $2 == "honnef.co/go/tools" {print $3}' tools/lint/go.mod)
stamp="$BIN/.staticcheck-$version"
if [[ ! -x "$BIN/staticcheck" || ! -e "$stamp" ]]; then
	echo "lint: building staticcheck $version"
	(cd tools/lint && "$GO" build -o "$BIN/staticcheck" honnef.co/go/tools/cmd/staticcheck)
	rm -f "$BIN"/.staticcheck-* && touch "$stamp"
fi

unformatted=$(gofmt -l $(git ls-files --cached --others --exclude-standard '*.go' | grep -v '\.pb\.go$' | grep -v '^tools/'))
if [[ -n "$unformatted" ]]; then
	echo "lint: gofmt would change:" >&2
	echo "$unformatted" >&2
	exit 1
fi
"$GO" vet ./...
"$BIN/staticcheck" ./...

# govulncheck reports the known vulnerabilities that the module's code can
# reach, in the modules it requires and in the Go release it is built with.
# One in a module fails the lint: a newer version of it fixes it. One in the
# Go release is printed, not failed on: the Go the machine has, or a newer
# one approved for it, is what fixes those (see README).
gover=$("$GO" env GOVERSION)
vulndb=$(awk '$1 == "golang.org/x/vulndb" {print $2} $1 == "require" && $2 == "golang.org/x/vulndb" {print $3}' tools/vuln/go.mod)
stamp="$BIN/.vulndb-$gover-$(cat tools/vuln/go.mod tools/vuln/go.sum | sha256sum | cut -c1-16)"
if [[ ! -x "$BIN/govulncheck" || ! -e "$stamp" || ! -e "$BIN/vulndb/index/db.json" ]]; then
	echo "lint: building govulncheck and the vulnerability database $vulndb"
	(cd tools/vuln && "$GO" build -o "$BIN/govulncheck" golang.org/x/vuln/cmd/govulncheck &&
		"$GO" build -o "$BIN/vulndb-index" golang.org/x/vulndb/cmd/indexdb)
	src=$(cd tools/vuln && "$GO" list -m -f '{{.Dir}}' golang.org/x/vulndb)
	rm -rf "$BIN/vulndb"
	"$BIN/vulndb-index" -vulns "$src/data/osv" -out "$BIN/vulndb"
	rm -f "$BIN"/.vulndb-* && touch "$stamp"
fi
report=$(mktemp)
trap 'rm -f "$report"' EXIT
"$BIN/govulncheck" -db "file://$BIN/vulndb" -format json ./... >"$report"
# A finding with a function in its trace is one the code reaches.
reached=$(jq -r 'select(.finding) | .finding | select(.trace[0].function != null) |
	"\(.trace[0].module) \(.trace[0].version) \(.osv) fixed in \(.fixed_version // "no release")"' "$report" | sort -u)
if stdlib=$(grep '^stdlib ' <<<"$reached"); then
	echo "lint: govulncheck: $(wc -l <<<"$stdlib") vulnerabilities of $gover the code reaches (https://pkg.go.dev/vuln/<id>):"
	sed 's/^stdlib [^ ]* /lint:   /' <<<"$stdlib"
fi
if modules=$(grep -v '^stdlib ' <<<"$reached" | grep .); then
	echo "lint: govulncheck: vulnerabilities the code reaches in the modules it requires; require the fixed versions:" >&2
	sed 's/^/lint:   /' <<<"$modules" >&2
	exit 1
fi
echo "lint: ok"
