#!/usr/bin/env bash
# asr-rl quickstart: the whole product on one machine, stage by stage (icefall style).
#   stage 0: synthesise the bilingual demo corpus (espeak-ng) and check its manifests
# Later stages (model init, SFT, GRPO, eval, report) arrive with their issues.
# Usage: bash recipes/quickstart.sh [stage] [stop_stage]; DEMO_SCALE=tiny|full
set -eou pipefail

stage=${1:-0}
stop_stage=${2:-100}
DEMO_SCALE=${DEMO_SCALE:-full}
EXP=${EXP:-exp/demo_${DEMO_SCALE}}
if [ "$DEMO_SCALE" = tiny ]; then N_TRAIN=${N_TRAIN:-60}; N_TEST=${N_TEST:-10}; else N_TRAIN=${N_TRAIN:-3000}; N_TEST=${N_TEST:-200}; fi
CORPUS=${CORPUS:-data/demo_corpus_${N_TRAIN}}

log() { local fname=${BASH_SOURCE[1]##*/}; echo -e "$(date '+%Y-%m-%d %H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"; }

mkdir -p "$EXP"
if [ $stage -le 0 ] && [ $stop_stage -ge 0 ]; then
  log "Stage 0: synthesise the demo corpus into $CORPUS ($N_TRAIN train, $N_TEST per test set)"
  start=$(date +%s)
  asr-rl data synth --out "$CORPUS" --langs en,zh --train "$N_TRAIN" --test "$N_TEST" --seed 1
  for split in train dev test_clean test_noisy; do asr-rl data check --manifest "$CORPUS/$split.jsonl" --max-notes 0; done
  log "Stage 0 done in $(( $(date +%s) - start )) s"
fi

if [ $stop_stage -ge 1 ]; then
  log "Stages 1+ (model init, SFT, GRPO, eval, report): coming soon"
fi
