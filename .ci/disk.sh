#!/usr/bin/env bash
# Sourced by .ci/run once CARGO_TARGET_DIR is set: keeps the build small and
# makes sure the disk can hold it before anything is built, so a full disk
# fails here, saying so, instead of as an LLVM I/O error deep in the tests.
#
# A cold run writes about COLD_GB under the target dir: 11.1 GiB measured
# (debug builds of the workspace and its feature sets 8.2, the release
# binaries 2.0, the fuzz builds 1.1), against 30 GiB with incremental caches
# and full debug info. A reused target dir needs only what changed, plus
# room for the crates rebuilt in place.

# Incremental caches pay back over many small edits, not in CI, where they
# only took space; full debug info is most of a debug build's size. Line
# tables keep file:line in panics and backtraces.
export CARGO_INCREMENTAL=0
export CARGO_PROFILE_DEV_DEBUG=line-tables-only

COLD_GB=${LEASEFENCE_CI_COLD_GB:-12}
REBUILD_GB=${LEASEFENCE_CI_REBUILD_GB:-4}

free_gb() { df -P -BG "$CARGO_TARGET_DIR" | awk 'NR == 2 { sub("G", "", $4); print $4 }'; }
used_gb() { du -sm "$CARGO_TARGET_DIR" 2>/dev/null | awk '{ print int($1 / 1024) }'; }

mkdir -p "$CARGO_TARGET_DIR"
used=$(used_gb)
free=$(free_gb)
need=$(( (COLD_GB > used ? COLD_GB - used : 0) + REBUILD_GB ))
echo "target dir $CARGO_TARGET_DIR: ${used} GB reused; ${free} GB free, about ${need} GB needed"
# cargo never removes what it no longer uses (artifacts of other flags,
# feature sets or dependency versions): a dir far beyond a cold build's
# size is mostly that, and a cold build frees it.
if [ "$used" -gt $(( 2 * COLD_GB )) ] || { [ "$free" -lt "$need" ] && [ "$used" -gt 0 ]; }; then
  echo "removing the reused build (cargo clean) and building cold"
  cargo clean -q
  mkdir -p "$CARGO_TARGET_DIR"
  used=0
  free=$(free_gb)
  need=$(( COLD_GB + REBUILD_GB ))
fi
if [ "$free" -lt "$need" ]; then
  echo "CI needs about ${need} GB free on the file system of $CARGO_TARGET_DIR and it has ${free} GB:" \
    "free some space there, or set CARGO_TARGET_DIR to a larger disk" >&2
  exit 1
fi
