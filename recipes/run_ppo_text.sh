#!/usr/bin/env bash
# PPO with a critic and a reward model on a text LLM (the general RLHF path), stage by stage.
#
#   stage 0: data: the toy text set (prompts + preference pairs) unless PROMPTS/PREFS are given
#   stage 1: asr-rl model init --arch qwen2: a small causal LM with a tokenizer from the data
#            (skip with POLICY=path to start from your own checkpoint)
#   stage 2: asr-rl train rm: a reward model from the preference pairs (skip with RM=path)
#   stage 3: asr-rl train ppo with GAE, a critic and the reward model ($CONFIG); BACKEND=ray for Ray
#
# Knobs are environment variables; extra key=value arguments go to `asr-rl train ppo`, e.g.
#   BACKEND=ray bash recipes/run_ppo_text.sh 0 3 max_steps=50
set -eou pipefail

stage=${1:-0}
stop_stage=${2:-3}
shift $(( $# < 2 ? $# : 2 )) || true
EXTRA=("$@")

EXP=${EXP:-exp/ppo_text}
DATA=${DATA:-data/text_demo}
PROMPTS=${PROMPTS:-$DATA/prompts.jsonl}
PREFS=${PREFS:-$DATA/prefs.jsonl}
SIZE=${SIZE:-tiny}
POLICY=${POLICY:-$EXP/init}
RM=${RM:-$EXP/rm/final}
CONFIG=${CONFIG:-recipes/configs/ppo_text.yaml}
BACKEND=${BACKEND:-local}
RM_STEPS=${RM_STEPS:-60}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

log() { local fname=${BASH_SOURCE[1]##*/}; echo -e "$(date '+%Y-%m-%d %H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"; }

if [ $stage -le 0 ] && [ $stop_stage -ge 0 ]; then
  log "Stage 0: data"
  [ -f "$PROMPTS" ] && [ -f "$PREFS" ] || python -m asr_rl.data.text_demo --out "$DATA"
fi

if [ $stage -le 1 ] && [ $stop_stage -ge 1 ]; then
  if [ -f "$POLICY/config.json" ]; then log "Stage 1: policy $POLICY exists"; else
    log "Stage 1: model init (qwen2, $SIZE) -> $POLICY"
    asr-rl model init --arch qwen2 --size "$SIZE" --tokenizer-from "$PROMPTS" "$PREFS" --out "$POLICY"
  fi
fi

if [ $stage -le 2 ] && [ $stop_stage -ge 2 ]; then
  if [ -f "$RM/config.json" ]; then log "Stage 2: reward model $RM exists"; else
    log "Stage 2: reward model from $PREFS"
    asr-rl train rm pretrain="$POLICY" prompt_data="$PREFS" output_dir="$EXP/rm" max_steps="$RM_STEPS" \
      optim.learning_rate=3e-3
  fi
fi

if [ $stage -le 3 ] && [ $stop_stage -ge 3 ]; then
  log "Stage 3: PPO (GAE + critic + reward model, backend=$BACKEND)"
  asr-rl train ppo --config "$CONFIG" pretrain="$POLICY" prompt_data="$PROMPTS" reward_pretrain="$RM" \
    output_dir="$EXP/ppo" backend="$BACKEND" "${EXTRA[@]}"
fi
