#!/usr/bin/env bash
# GRPO from an SFT checkpoint, then evaluation (icefall-style stages).
#
#   stage 0: check the inputs (SFT model folder, manifests) and, for the demo corpus, synthesise it
#   stage 1: Ray: join $RAY_ADDRESS when set; otherwise the trainer starts an embedded local Ray
#   stage 2: asr-rl train grpo with $CONFIG (Ray + DeepSpeed when BACKEND=ray; vLLM when ENGINE=vllm)
#   stage 3: asr-rl eval of the SFT start and the GRPO result on every test set
#
# Every knob is an environment variable (defaults below) and any extra key=value argument is passed
# to `asr-rl train grpo` unchanged, e.g.
#   SFT_MODEL=exp/sft/final bash recipes/run_grpo_from_sft.sh 0 3 max_steps=200 zero_stage=3
# On a GPU cluster: RAY_ADDRESS=auto BACKEND=ray ENGINE=vllm ZERO_STAGE=3 NUM_RANKS=8 ...
set -eou pipefail

stage=${1:-0}
stop_stage=${2:-3}
shift $(( $# < 2 ? $# : 2 )) || true
EXTRA=("$@")

CORPUS=${CORPUS:-data/demo_corpus_3000}
SFT_MODEL=${SFT_MODEL:-exp/demo/sft/final}
TRAIN_MANIFEST=${TRAIN_MANIFEST:-$CORPUS/train.jsonl}  # the utterances the rollouts hear
EVAL_MANIFEST=${EVAL_MANIFEST:-$CORPUS/dev.jsonl}  # the RL run's own curve (the target's dev set, adapting)
EXP=${EXP:-exp/demo}
ARCH=${ARCH:-qwen2_audio}
if [ "$ARCH" = qwen3_asr ]; then CONFIG=${CONFIG:-recipes/configs/grpo_scratch.yaml}; else CONFIG=${CONFIG:-recipes/configs/grpo_demo.yaml}; fi
BACKEND=${BACKEND:-ray}
ENGINE=${ENGINE:-hf}
NUM_RANKS=${NUM_RANKS:-2}
ZERO_STAGE=${ZERO_STAGE:-2}
MAX_STEPS=${MAX_STEPS:-60}
MAX_MINUTES=${MAX_MINUTES:-0}
REWARD_URL=${REWARD_URL:-}
TEST_SETS=${TEST_SETS:-test_clean test_noisy}
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OMP_NUM_THREADS

log() { local fname=${BASH_SOURCE[1]##*/}; echo -e "$(date '+%Y-%m-%d %H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"; }

if [ $stage -le 0 ] && [ $stop_stage -ge 0 ]; then
  log "Stage 0: inputs"
  if [ ! -f "$CORPUS/train.jsonl" ]; then
    log "synthesising the demo corpus into $CORPUS"
    asr-rl data synth --out "$CORPUS" --train 3000 --test 200 --seed 1
  fi
  [ -f "$SFT_MODEL/config.json" ] || { log "SFT model $SFT_MODEL not found: run recipes/run_sft.sh first"; exit 1; }
fi

if [ $stage -le 1 ] && [ $stop_stage -ge 1 ]; then
  if [ -n "${RAY_ADDRESS:-}" ]; then
    log "Stage 1: joining the Ray cluster at $RAY_ADDRESS"; ray status >/dev/null
  else
    log "Stage 1: no RAY_ADDRESS: the trainer starts an embedded local Ray"
  fi
fi

if [ $stage -le 2 ] && [ $stop_stage -ge 2 ]; then
  log "Stage 2: GRPO (backend=$BACKEND, engine=$ENGINE, ranks=$NUM_RANKS, ZeRO-$ZERO_STAGE)"
  start=$(date +%s)
  reward_args=()
  # a remote reward replaces the config's built-in terms (the server scores with its own)
  [ -n "$REWARD_URL" ] && reward_args=("reward.remote_url=$REWARD_URL" "reward.terms=null")
  asr-rl train grpo --config "$CONFIG" pretrain="$SFT_MODEL" train_manifest="$TRAIN_MANIFEST" \
    eval_manifest="$EVAL_MANIFEST" output_dir="$EXP/grpo" backend="$BACKEND" rollout.engine="$ENGINE" \
    distributed.actor_num_gpus_per_node="$NUM_RANKS" distributed.zero_stage="$ZERO_STAGE" \
    max_steps="$MAX_STEPS" max_minutes="$MAX_MINUTES" "${reward_args[@]}" "${EXTRA[@]}"
  log "Stage 2 done in $(( $(date +%s) - start )) s"
fi

if [ $stage -le 3 ] && [ $stop_stage -ge 3 ]; then
  log "Stage 3: evaluate SFT and GRPO"
  sets=()
  for s in $TEST_SETS; do sets+=(--test-set "$s=$CORPUS/$s.jsonl"); done
  asr-rl eval --model "$SFT_MODEL" "${sets[@]}" --output "$EXP/eval/sft" --quiet
  asr-rl eval --model "$EXP/grpo/final" "${sets[@]}" --output "$EXP/eval/grpo" --quiet
fi
