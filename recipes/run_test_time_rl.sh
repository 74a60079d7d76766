#!/usr/bin/env bash
# Test-time RL: adapt an SFT'd model on the very audio you need transcribed, then transcribe it
# (TTRL, arXiv:2504.16084; docs/workflows/test-time-rl.md). No transcript is read: the reward needs
# none (recipes/configs/grpo_test_time.yaml: consensus + silence; REWARD_URL or reward.file=FILE.py
# for a domain's verifier).
#
#   stage 1: asr-rl train grpo on $POOL from $MODEL, on Ray + DeepSpeed ($NUM_RANKS ranks)
#   stage 2: asr-rl data pseudo-label: $EXP/transcripts.jsonl, the pool with each line's transcript
#            (greedy; BEST_OF=N: the best of N samples by $RERANK_REWARD, RL and reranking together)
#   stage 3: only with POOL_LABELLED (the same lines with their transcripts, kept aside for checking):
#            asr-rl eval of the start and the adapted model on them, and --compare (intervals)
#
# Usage: MODEL=exp/sft/best POOL=pool.jsonl EXP=exp/ttrl bash recipes/run_test_time_rl.sh [stage] [stop] [key=value ...]
# Extra key=value arguments go to `asr-rl train grpo` unchanged (max_steps=500, seed=2, ...).
set -eou pipefail

stage=${1:-1}
stop_stage=${2:-3}
shift $(( $# < 2 ? $# : 2 )) || true
EXTRA=("$@")

MODEL=${MODEL:?set MODEL to the SFT checkpoint folder}
POOL=${POOL:?set POOL to the manifest of the audio to transcribe}
EXP=${EXP:-exp/test_time_rl}
CONFIG=${CONFIG:-recipes/configs/grpo_test_time.yaml}
NUM_RANKS=${NUM_RANKS:-2}
REWARD_URL=${REWARD_URL:-}
BEST_OF=${BEST_OF:-1}
RERANK_REWARD=${RERANK_REWARD:-builtin:consensus=1,silence=1}
POOL_LABELLED=${POOL_LABELLED:-}
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OMP_NUM_THREADS

log() { local fname=${BASH_SOURCE[1]##*/}; echo -e "$(date '+%Y-%m-%d %H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"; }
[ -f "$MODEL/config.json" ] || { log "MODEL=$MODEL is not a model folder (no config.json)"; exit 1; }
[ -f "$POOL" ] || { log "POOL=$POOL does not exist"; exit 1; }

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  log "Stage 1: test-time GRPO on $POOL from $MODEL"
  reward_args=()
  [ -n "$REWARD_URL" ] && reward_args=("reward.remote_url=$REWARD_URL" "reward.terms=null")
  asr-rl train grpo --config "$CONFIG" pretrain="$MODEL" train_manifest="$POOL" output_dir="$EXP/rl" \
    backend=ray distributed.actor_num_gpus_per_node="$NUM_RANKS" resume=auto "${reward_args[@]}" "${EXTRA[@]}"
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  log "Stage 2: transcribe $POOL with $EXP/rl/final -> $EXP/transcripts.jsonl"
  best=()
  [ "$BEST_OF" -gt 1 ] && best=(--best-of "$BEST_OF" --reward "$RERANK_REWARD")
  asr-rl data pseudo-label "$EXP/rl/final" "$POOL" --out "$EXP/transcripts.jsonl" "${best[@]}"
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ] && [ -n "$POOL_LABELLED" ]; then
  log "Stage 3: CER on the pool (its transcripts from $POOL_LABELLED), start against adapted"
  asr-rl eval --model "$MODEL" --test-set "pool=$POOL_LABELLED" --output "$EXP/eval/start" --quiet
  asr-rl eval --model "$EXP/rl/final" --test-set "pool=$POOL_LABELLED" --output "$EXP/eval/adapted" --quiet
  asr-rl eval --compare "$EXP/eval/start" "$EXP/eval/adapted" --output "$EXP/eval/compare"
fi
