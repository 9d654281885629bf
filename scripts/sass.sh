#!/usr/bin/env bash
# A kernel's machine code (SASS) without a GPU: compiles one .cu file for sm_90a with the build's own compile line,
# and disassembles the kernels whose mangled names match a pattern.
#   bash scripts/sass.sh [--build DIR] [--ops | --loops] src/cuda/kernels/<dir>/<file>.cu [name-regex]
# Without a pattern: every kernel's name and instruction count. With one: those kernels' SASS (address, instruction),
# with --ops the count of each opcode in them, or with --loops each loop's span and length in instructions and the
# barriers, wgmma waits and stores around them (what one trip of a main loop costs, stop 68). The CUDA 13 toolkit
# here ships no disassembler; Debian bookworm's non-free nvidia-cuda-toolkit (CUDA 11.8) has cuobjdump, which reads
# an sm_90 cubin once its ELF header is in the older form (ABI version 7, EF_CUDA_SM90 flags): the first run
# downloads that package (~84 MB) into
# ${LILAC_SASS_TOOLS:-~/.cache/lilac-sass} and keeps only cuobjdump / nvdisasm. The instructions are the binary's;
# only the header is rewritten, so a counter or a latency read from here is the device's code (stop 67).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD="" OPS=0 LOOPS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --ops) OPS=1; shift ;;
    --loops) LOOPS=1; shift ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { sed -n 4,5p "$0" >&2; exit 3; }
FILE=${1#./}
PAT=${2:-}
if [ -z "$BUILD" ]; then
  for d in build-cuda build; do [ -f "$d/build.ninja" ] && BUILD=$d && break; done
fi
[ -n "$BUILD" ] && [ -f "$BUILD/build.ninja" ] || { echo "sass: no configured CUDA build folder (--build)" >&2; exit 3; }

TOOLS=${LILAC_SASS_TOOLS:-$HOME/.cache/lilac-sass}
if [ ! -x "$TOOLS/cuobjdump" ]; then
  mkdir -p "$TOOLS/apt/lists"
  cat > "$TOOLS/apt/nonfree.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  APT=(-o Dir::Etc::sourcelist="$TOOLS/apt/nonfree.sources" -o Dir::Etc::sourceparts=/dev/null -o Dir::State::Lists="$TOOLS/apt/lists")
  echo "sass: fetching Debian's nvidia-cuda-toolkit for cuobjdump (once)" >&2
  apt-get "${APT[@]}" update >/dev/null
  (cd "$TOOLS/apt" && apt-get "${APT[@]}" download nvidia-cuda-toolkit >/dev/null 2>&1)
  dpkg-deb -x "$TOOLS"/apt/nvidia-cuda-toolkit_*.deb "$TOOLS/x"
  cp "$TOOLS/x/usr/bin/cuobjdump" "$TOOLS/x/usr/bin/nvdisasm" "$TOOLS/"
  rm -rf "$TOOLS/x" "$TOOLS"/apt/*.deb
fi

obj=$(ninja -C "$BUILD" -t targets all 2>/dev/null | grep -o "^[^:]*/${FILE}\.o" | head -1)
[ -n "$obj" ] || { echo "sass: $FILE is not compiled by $BUILD" >&2; exit 3; }
cmd=$(ninja -C "$BUILD" -t commands "$obj" | tail -1)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# the compile line as a cubin for sm_90a, no dependency file
cmd=$(echo "$cmd" | sed -E 's# -MD##; s# -MT [^ ]+##; s# -MF [^ ]+##; s# -c # #; s# -o [^ ]+# -cubin -o '"$TMP"'/k.cubin#;
                          s# --generate-code=[^ ]+##g; s#nvcc #nvcc -arch=sm_90a #')
(cd "$BUILD" && eval "$cmd") >&2
python3 - "$TMP/k.cubin" <<'EOF'
import struct, sys
p = sys.argv[1]
d = bytearray(open(p, 'rb').read())
d[8] = 7                                  # EI_ABIVERSION of the CUDA 11 cubins
struct.pack_into('<I', d, 48, 0x5a055a)   # EF_CUDA_SM90 | virtual SM90 | 64-bit addresses | unified texture mode
open(p, 'wb').write(d)
EOF
"$TOOLS/cuobjdump" -sass "$TMP/k.cubin" > "$TMP/k.sass"
# one line per instruction: <function>\t<address>\t<instruction>
awk '/Function :/ { f = $3; next }
     /^[ \t]+\/\*[0-9a-f]+\*\// { a = $1; gsub(/[\/*]/, "", a); $1 = ""; sub(/^ +/, ""); sub(/ *;.*$/, ""); print f "\t" a "\t" $0 }' \
  "$TMP/k.sass" > "$TMP/k.tsv"
if [ -z "$PAT" ]; then
  cut -f1 "$TMP/k.tsv" | uniq -c | awk '{ printf "%6d  %s\n", $1, $2 }'
elif [ $LOOPS = 1 ]; then
  # each loop (a backward branch) of the matching kernels with its length in instructions, and where the barriers,
  # wgmma waits and global stores sit: a loop's instructions per trip, its stores' tail apart (stop 68)
  awk -F'\t' -v p="$PAT" '$1 ~ p' "$TMP/k.tsv" | python3 -c '
import re, sys
rows = [l.rstrip("\n").split("\t") for l in sys.stdin]
fn = None
for i, (f, a, ins) in enumerate(rows):
    if f != fn:
        fn, at = f, {int(r[1], 16): j for j, r in enumerate(rows) if r[0] == f}
        print("== " + f)
    m = re.search(r"BRA (?:`\()?0x([0-9a-f]+)", ins)
    if m and int(m.group(1), 16) <= int(a, 16) and int(m.group(1), 16) in at:
        j = at[int(m.group(1), 16)]
        print(f"loop  {rows[j][1]}..{a}  {i - j + 1} instructions")
    elif re.match(r"(BAR\.SYNC|WARPGROUP\.DEPBAR|STG|EXIT)", re.sub(r"^@!?U?P[0-9T] ", "", ins)):
        print(f"      {a}  {ins}")
'
elif [ $OPS = 1 ]; then
  awk -F'\t' -v p="$PAT" '$1 ~ p { i = $3; sub(/^@!?U?P[0-9T] /, "", i); split(i, w, /[ .]/); n[w[1]]++ }
                          END { for (o in n) printf "%6d  %s\n", n[o], o }' "$TMP/k.tsv" | sort -rn
else
  awk -F'\t' -v p="$PAT" '$1 ~ p { if ($1 != last) { print "== " $1; last = $1 } print $2 "  " $3 }' "$TMP/k.tsv"
fi
