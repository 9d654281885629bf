#!/usr/bin/env bash
# Whether a change leaves CUDA files' code the same, without a GPU: compiles each file to PTX (sm_90a) as the working
# tree has it and at a base revision (each in a temporary git worktree, so header changes count) with the build's own
# compile command, and compares them with scripts/ptx_compare.py. For refactors of kernels that must keep their bits and speed: identical
# PTX is the same machine code; anything else needs the device (tests, and a timing where it matters).
#   bash scripts/ptx-same.sh [--base REV] [--build DIR] src/cuda/kernels/<dir>/<file>.cu ...
# --base: default HEAD; --build: a configured CUDA build folder (default build-cuda, else build). Exit 0 when every file
# is identical, 1 when some differ only in virtual register numbers, 2 when some differ.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BASE=HEAD
BUILD=""
FILES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base) BASE=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    *) FILES+=("$1"); shift ;;
  esac
done
if [ -z "$BUILD" ]; then
  for d in build-cuda build; do [ -f "$d/build.ninja" ] && BUILD=$d && break; done
fi
if [ -z "$BUILD" ] || [ ! -f "$BUILD/build.ninja" ]; then echo "ptx-same: no configured build folder (--build)" >&2; exit 3; fi
if [ ${#FILES[@]} = 0 ]; then echo "ptx-same: name one or more .cu files" >&2; exit 3; fi
TMP=$(mktemp -d)
# Both versions are compiled from a worktree at the same path: nvcc's code can depend on the source's path (anonymous
# namespaces are named after it, and a change that gives identical PTX at one path gave a differently vectorized load
# at another), so the working tree itself is not compared with a copy elsewhere. The working tree's
# tracked changes become a commit object (git stash create; nothing is stashed).
NEW=$(git stash create)
[ -z "$NEW" ] && NEW=HEAD
trap 'git -C "$ROOT" worktree remove --force "$TMP/src" >/dev/null 2>&1; rm -rf "$TMP"' EXIT
# ptx REV FILE OUT: FILE's PTX at REV
ptx() {
  git -C "$ROOT" worktree add --detach "$TMP/src" "$1" >/dev/null 2>&1 || return 3
  local cmd
  cmd=${PTXCMD//$ROOT\//$TMP/src/}
  (cd "$BUILD" && eval "${cmd//OUT/$3}") > "$TMP/log" 2>&1
  local rc=$?
  git -C "$ROOT" worktree remove --force "$TMP/src" >/dev/null 2>&1
  return $rc
}
git rev-parse --verify -q "$BASE^{commit}" >/dev/null || { echo "ptx-same: no revision $BASE" >&2; exit 3; }
worst=0
for f in "${FILES[@]}"; do
  f=${f#./}
  obj=$(ninja -C "$BUILD" -t targets all 2>/dev/null | grep -o "^[^:]*/${f}\.o" | head -1)
  if [ -z "$obj" ]; then echo "$f: not compiled by $BUILD"; worst=2; continue; fi
  cmd=$(ninja -C "$BUILD" -t commands "$obj" | tail -1)
  # the compile line as PTX for sm_90a, no dependency file, no line info
  PTXCMD=$(echo "$cmd" | sed -E 's# -MD##; s# -MT [^ ]+##; s# -MF [^ ]+##; s# -c # #; s# -lineinfo##; s# -o [^ ]+# -ptx -o OUT#;
                                 s# --generate-code=[^ ]+##g; s#nvcc #nvcc -arch=sm_90a #')
  ptx "$NEW" "$f" "$TMP/new.ptx" || { echo "$f: does not compile"; head -5 "$TMP/log"; worst=2; continue; }
  ptx "$BASE" "$f" "$TMP/old.ptx" || { echo "$f: does not compile at $BASE"; worst=2; continue; }
  echo -n "$f: "
  python3 "$ROOT/scripts/ptx_compare.py" "$TMP/old.ptx" "$TMP/new.ptx"
  rc=$?
  [ $rc -gt $worst ] && worst=$rc
done
exit $worst
