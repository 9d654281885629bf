#!/usr/bin/env bash
# Whether a change leaves CUDA files' code the same, without a GPU: compiles each file to PTX (sm_90a) in the working
# tree and at a base revision (a temporary git worktree, so header changes count) with the build's own compile command,
# and compares them with scripts/ptx_compare.py. For refactors of kernels that must keep their bits and speed: identical
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
trap 'git -C "$ROOT" worktree remove --force "$TMP/base" >/dev/null 2>&1; rm -rf "$TMP"' EXIT
git worktree add --detach "$TMP/base" "$BASE" >/dev/null 2>&1 || { echo "ptx-same: no revision $BASE" >&2; exit 3; }
worst=0
for f in "${FILES[@]}"; do
  f=${f#./}
  obj=$(ninja -C "$BUILD" -t targets all 2>/dev/null | grep -o "^[^:]*/${f}\.o" | head -1)
  if [ -z "$obj" ]; then echo "$f: not compiled by $BUILD"; worst=2; continue; fi
  cmd=$(ninja -C "$BUILD" -t commands "$obj" | tail -1)
  # the compile line as PTX for the first (sm_90a) target, no dependency file, no line info
  ptx=$(echo "$cmd" | sed -E 's# -MD##; s# -MT [^ ]+##; s# -MF [^ ]+##; s# -c # #; s# -lineinfo##; s# -o [^ ]+# -ptx -o OUT#;
                              s# --generate-code=[^ ]+##g; s#nvcc #nvcc -arch=sm_90a #')
  out_new="$TMP/new.ptx"; out_old="$TMP/old.ptx"
  (cd "$BUILD" && eval "${ptx//OUT/$out_new}") > "$TMP/new.log" 2>&1 || { echo "$f: does not compile"; cat "$TMP/new.log" | head -5; worst=2; continue; }
  old=${ptx//$ROOT\//$TMP/base/}
  (cd "$BUILD" && eval "${old//OUT/$out_old}") > "$TMP/old.log" 2>&1 || { echo "$f: does not compile at $BASE"; worst=2; continue; }
  echo -n "$f: "
  python3 "$ROOT/scripts/ptx_compare.py" "$out_old" "$out_new"
  rc=$?
  [ $rc -gt $worst ] && worst=$rc
done
exit $worst
