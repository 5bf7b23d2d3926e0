#!/usr/bin/env bash
# lint.sh: gofmt, go vet and staticcheck (pinned in tools/lint) over the module.
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
echo "lint: ok"
