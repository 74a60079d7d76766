#!/usr/bin/env bash
# SFT of an audio-LLM on a manifest (icefall-style stages).
#
#   stage 0: the demo corpus (synthesised offline with espeak-ng) unless CORPUS already holds one
#   stage 1: asr-rl model init --arch $ARCH: Qwen2-Audio on the pretrained Whisper tiny.en encoder
#            (default), or ARCH=qwen3_asr: a randomly initialised Qwen3-ASR; a tokenizer from the
#            training texts (skip with INIT_MODEL=path to start from an existing checkpoint)
#   stage 2: asr-rl train sft with $CONFIG (qwen2_audio: CE on the frozen encoder's cached states;
#            qwen3_asr: CE + auxiliary CTC, SpecAugment, noise)
#   stage 3: asr-rl eval on the test sets
#
# Knobs are environment variables; extra key=value arguments go to `asr-rl train sft`, e.g.
#   MAX_MINUTES=5 bash recipes/run_sft.sh 0 3 optim.learning_rate=1e-3
set -eou pipefail

stage=${1:-0}
stop_stage=${2:-3}
shift $(( $# < 2 ? $# : 2 )) || true
EXTRA=("$@")

CORPUS=${CORPUS:-data/demo_corpus_3000}
N_TRAIN=${N_TRAIN:-3000}
N_TEST=${N_TEST:-200}
EXP=${EXP:-exp/demo}
SIZE=${SIZE:-small}
ARCH=${ARCH:-qwen2_audio}
ENCODER=${ENCODER:-default}  # qwen2_audio: whisper-tiny.en (packaged) or a Hugging Face Whisper folder
INIT_MODEL=${INIT_MODEL:-$EXP/init}
TOKENIZER_FROM=${TOKENIZER_FROM:-$CORPUS/train.jsonl}  # manifests (space-separated) whose texts make the vocabulary
if [ "$ARCH" = qwen3_asr ]; then CONFIG=${CONFIG:-recipes/configs/sft_scratch.yaml}; else CONFIG=${CONFIG:-recipes/configs/sft_demo.yaml}; fi
MAX_MINUTES=${MAX_MINUTES:-15}
TEST_SETS=${TEST_SETS:-test_clean test_noisy}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

log() { local fname=${BASH_SOURCE[1]##*/}; echo -e "$(date '+%Y-%m-%d %H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"; }

if [ $stage -le 0 ] && [ $stop_stage -ge 0 ]; then
  log "Stage 0: corpus $CORPUS"
  [ -f "$CORPUS/train.jsonl" ] || asr-rl data synth --out "$CORPUS" --train "$N_TRAIN" --test "$N_TEST" --seed 1
fi

if [ $stage -le 1 ] && [ $stop_stage -ge 1 ]; then
  if [ -f "$INIT_MODEL/config.json" ]; then
    log "Stage 1: starting model $INIT_MODEL exists"
  else
    log "Stage 1: model init ($ARCH, $SIZE, encoder $ENCODER) -> $INIT_MODEL"
    asr-rl model init --arch "$ARCH" --size "$SIZE" --encoder "$ENCODER" --tokenizer-from $TOKENIZER_FROM \
      --out "$INIT_MODEL"
  fi
fi

if [ $stage -le 2 ] && [ $stop_stage -ge 2 ]; then
  log "Stage 2: SFT for up to $MAX_MINUTES minutes"
  start=$(date +%s)
  asr-rl train sft --config "$CONFIG" pretrain="$INIT_MODEL" train_manifest="$CORPUS/train.jsonl" \
    eval_manifest="$CORPUS/dev.jsonl" output_dir="$EXP/sft" max_minutes="$MAX_MINUTES" "${EXTRA[@]}"
  log "Stage 2 done in $(( $(date +%s) - start )) s"
fi

if [ $stage -le 3 ] && [ $stop_stage -ge 3 ]; then
  log "Stage 3: evaluate"
  sets=()
  for s in $TEST_SETS; do sets+=(--test-set "$s=$CORPUS/$s.jsonl"); done
  asr-rl eval --model "$EXP/sft/final" "${sets[@]}" --output "$EXP/eval/sft" --quiet
fi
