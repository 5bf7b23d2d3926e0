// Package bench holds the local cluster's benchmarks (`make bench`):
// the cold build of its tools, its start time and how fast pods get Ready.
// They print `bench: <name> <value>` lines.
package bench
