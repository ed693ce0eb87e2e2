#!/bin/bash
# minivllm serve and llama.cpp's llama-server, interleaved round by round, the same client
# (`minivllm bench serve --base-url`) at 1 and 32 streams; figures/reference_numbers.md, issue 26.
#   LLAMA_SERVER=path/to/llama-server GGUF=smollm2-q8_0.gguf scripts/side_by_side.sh OUTDIR ROUNDS
# Each round starts every server below alone, benchmarks it, stops it. Then the table:
# scripts/side_by_side_table.py OUTDIR. INPUT_LEN (default 64: issue 47's prompts) and
# TARGET_ITL_MS (default 150: the minivllm-itl server's --target-itl-ms) may be set; GOODPUT
# (e.g. "ttft:2000 tpot:150") is passed to every run's --goodput.
set -eu
OUT=$1; ROUNDS=$2
: "${LLAMA_SERVER:?path of llama-server}" "${GGUF:?the GGUF llama-server loads}"
mkdir -p "$OUT"
MV="minivllm serve --max-num-seqs 32 --max-model-len 512 --kv-cache-dtype float16 --port 8000"
LS="$LLAMA_SERVER -m $GGUF -t 2 --parallel 32 --cont-batching --port 8080"
SERVERS=(  # label|port|command
  "llama|8080|$LS -c 16384"                           # 32 slots of 512 tokens, f16: 360 MiB
  "minivllm|8000|$MV --kv-cache-memory-bytes 360M"    # the same bytes: 16,384 float16 tokens
  "llama-unified-8k|8080|$LS -c 8192 --kv-unified"    # half the cache, shared by the slots
  "minivllm-180M|8000|$MV --kv-cache-memory-bytes 180M"  # 8,192 tokens: 32 x 256 in use at once
  # the same bytes, each step's prompt tokens sized to keep the running streams' ITL in target
  "minivllm-itl|8000|$MV --kv-cache-memory-bytes 360M --target-itl-ms ${TARGET_ITL_MS:-150}"
)
ready() { for _ in $(seq 600); do curl -sf -o /dev/null "http://127.0.0.1:$1/health" && return; sleep 0.2; done; return 1; }
bench() {  # label port pid round
  for c in 1 32; do
    minivllm bench serve --base-url "http://127.0.0.1:$2" --label "$1" --server-pid "$3" \
      --max-concurrency $c --num-prompts $((c == 1 ? 8 : 64)) --num-warmups $((c == 1 ? 2 : 32)) \
      --random-input-len "${INPUT_LEN:-64}" --random-output-len 128 \
      ${GOODPUT:+--goodput $GOODPUT} --json "$OUT/r$4-$1-c$c.json" > "$OUT/r$4-$1-c$c.log" 2>&1
  done
}
for r in $(seq "$ROUNDS"); do
  for server in "${SERVERS[@]}"; do
    IFS='|' read -r label port cmd <<< "$server"
    echo "$(date +%T) round $r $label, load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$OUT/rounds.log"
    $cmd > "$OUT/r$r-$label.server.log" 2>&1 &
    pid=$!
    ready "$port" && bench "$label" "$port" "$pid" "$r"
    kill "$pid"; wait "$pid" || true
  done
done
