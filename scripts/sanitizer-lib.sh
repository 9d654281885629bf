# Sourced by the sanitizer scripts (test-asan.sh, test-tsan.sh, fuzz.sh): clang and its runtime libraries, and a
# CPU-only clang build folder configured once with the given sanitizer flags.

# Installs clang and libclang-rt-dev (libFuzzer, the sanitizers) when missing (besides what install-deps.sh installs).
need_clang() {
  local missing=() p
  for p in clang libclang-rt-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
}

# configure_sanitized BUILD FLAGS: a RelWithDebInfo clang build in BUILD (no CUDA, no benchmarks), compiled and linked
# with FLAGS (e.g. "-fsanitize=thread"), unless BUILD is configured already.
configure_sanitized() {
  local build=$1 flags=$2
  [ -f "$build/build.ninja" ] && return 0
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLILAC_CUDA=OFF \
    -DLILAC_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="$(echo "$flags" | grep -oE -- '-fsanitize=[^ ]+')" >/dev/null
}
