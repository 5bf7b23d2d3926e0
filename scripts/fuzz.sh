#!/usr/bin/env bash
# fuzz.sh: runs every native fuzz target in the module for FUZZTIME each
# (default 5s). Crashers are written to the package's testdata/fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-5s}
status=0
while IFS=: read -r file _ line; do
	name=$(sed -E 's/^func (Fuzz[A-Za-z0-9_]*).*/\1/' <<<"$line")
	dir=$(dirname "$file")
	pkg=./${dir#./}
	echo "fuzz: $pkg $name ($FUZZTIME)"
	if ! "$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg" >/tmp/fuzz.$$.log 2>&1; then
		cat /tmp/fuzz.$$.log
		status=1
	fi
done < <(grep -rnE --include='*_test.go' --exclude-dir=tools --exclude-dir=bin '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' .)
rm -f /tmp/fuzz.$$.log
exit $status
