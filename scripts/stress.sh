#!/usr/bin/env bash
# stress.sh: runs test packages repeatedly while CPU hogs load the machine,
# to find tests (and product races) that fail only under load.
#
#   scripts/stress.sh                  # the unit packages, COUNT=5
#   PKGS=./waypoint/... COUNT=20 scripts/stress.sh
#
# Environment:
#   PKGS   packages (default: every package but the local-cluster ones)
#   COUNT  go test -count (default 5)
#   CPU    go test -cpu list (default 1,2,4)
#   HOGS   busy loops beside the tests (default: the number of cores)
#   RUN    go test -run filter (default: all)
# Every run is -race and is a test process of its own (go test -count=1
# for each round and -cpu value), so a test against the shared API server
# of internal/apitest, which creates objects of fixed names, meets a fresh
# server each time rather than what its previous round left. The hogs end
# with the script, whatever its outcome; it fails if any round failed.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
COUNT=${COUNT:-5}
CPU=${CPU:-1,2,4}
HOGS=${HOGS:-$(nproc)}
RUN=${RUN:-.}
if [[ -z ${PKGS:-} ]]; then
	# The local-cluster packages take minutes a run; name them in PKGS to
	# include them.
	PKGS=$("$GO" list ./... | grep -vE '/(e2e|system|bench|demo)$' | tr '\n' ' ')
fi

hogs=()
cleanup() {
	if ((${#hogs[@]})); then
		kill "${hogs[@]}" 2>/dev/null || true
		wait "${hogs[@]}" 2>/dev/null || true
	fi
}
trap cleanup EXIT
for ((i = 0; i < HOGS; i++)); do
	(while :; do :; done) &
	hogs+=($!)
done
failed=0
for ((round = 1; round <= COUNT; round++)); do
	for cpu in ${CPU//,/ }; do
		echo "stress: round $round of $COUNT, $HOGS hogs; go test -race -count=1 -cpu=$cpu -run '$RUN'"
		# shellcheck disable=SC2086 # PKGS is a list
		"$GO" test -race -count=1 -cpu="$cpu" -run "$RUN" $PKGS || failed=1
	done
done
exit "$failed"
