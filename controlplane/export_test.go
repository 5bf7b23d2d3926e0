package controlplane

// MaxHealthWatches is maxHealthWatches, for the external tests.
const MaxHealthWatches = maxHealthWatches
