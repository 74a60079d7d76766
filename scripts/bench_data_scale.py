"""Lazy at any size (issue 40): start-up time and memory of SFT and GRPO on manifests of 3k, 30k and
300k utterances, in each format the readers take.

Usage:
    asr-rl data synth --out /tmp/scale/corpus --train 200 --test 10 --langs en
    asr-rl model init --arch qwen2_audio --size small --tokenizer-from /tmp/scale/corpus/train.jsonl \
        --out /tmp/scale/model
    python scripts/bench_data_scale.py --corpus /tmp/scale/corpus --model /tmp/scale/model \
        [--sizes 3000 30000 300000] [--formats jsonl nemo parquet kaldi] [--no-duration] [--out /tmp/bench_scale]

The corpus's training audio is reused under distinct ids (no new audio): each manifest of N rows
names the same files N / len(corpus) times, with the rows' `duration` (as real manifests carry it;
`--no-duration` drops it, so that every header must be opened). For each (format, N), in its own
process each: `asr-rl train sft` for 50 steps (batch 8, length-bucketed) and `asr-rl train grpo`
for 20 steps (local backend, 2 utterances x 4 samples, reward 1 - CER), both with
`model.encoder_cache=<out>/cache_<format>_<N>` (SFT writes it, GRPO reads it) and no waveform
augmentation (`augment.noise_prob=0`). Measured:
  start-up: from the process's start to the start of step 1 (the time step 1's metrics line was
            written, less that step's `time/step`),
  peak RSS: the kernel's `ru_maxrss` of the process (os.wait4; data loading runs in its threads),
  cache:    the encoder cache's size on disk (a file or a folder) and the RAM it reports, if any.
Prints one table and the ratios of the largest size to the smallest (targets: RSS within +15%,
start-up within 3x). The machine should be quiet meanwhile.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ASR_RL = str(Path(sys.executable).parent / "asr-rl")
FORMATS = ("jsonl", "nemo", "parquet", "kaldi")
# no waveform augmentation: one cached row per utterance (what the numbers in BENCHMARKS.md were
# measured with), so that the reading cost is what differs between the sizes
COMMON = ["save_steps=0", "eval_steps=0", "logging.tensorboard=false", "logging.progress_bar=false",
          "logging.logging_steps=10", "num_threads=1", "augment.noise_prob=0"]
SFT = ["max_steps=50", "train_batch_size=8", "micro_train_batch_size=8", "data.bucket_batches=20"]
GRPO = ["max_steps=20", "backend=local", "rollout.rollout_batch_size=2", "rollout.n_samples_per_prompt=4",
        "rollout.max_new_tokens=16", "optim.micro_train_batch_size=8", "reward.terms={cer: 1.0}"]


def base_rows(corpus: Path) -> list[dict]:
    """The corpus's training rows with absolute audio paths."""
    rows = [json.loads(line) for line in (corpus / "train.jsonl").read_text().splitlines() if line.strip()]
    for r in rows:
        r["audio"] = str((corpus / r["audio"]).resolve())
    return rows


def scaled(rows: list[dict], n: int, durations: bool):
    """`n` rows cycling through `rows`, each under its own id."""
    for i in range(n):
        r = dict(rows[i % len(rows)], id=f"u{i:07d}-{rows[i % len(rows)]['id']}")
        if not durations:
            r.pop("duration", None)
        yield r


def write_manifest(fmt: str, rows: list[dict], n: int, out: Path, durations: bool) -> Path:
    """A training set of `n` rows in `fmt`; returns what `train_manifest=` names."""
    if fmt in ("jsonl", "nemo"):
        path = out / f"train.{fmt}.jsonl"
        with open(path, "w") as f:
            for r in scaled(rows, n, durations):
                if fmt == "nemo":
                    r = {"audio_filepath": r.pop("audio"), "lang": r.pop("language"), **r}
                f.write(json.dumps(r) + "\n")
        return path
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        keys = ("id", "audio", "text", "language", "speaker") + (("duration",) if durations else ())
        table = {k: [] for k in keys}
        for r in scaled(rows, n, durations):
            for k in keys:
                table[k].append(r[k])
        path = out / "train.parquet"
        pq.write_table(pa.table(table), path, row_group_size=10000)
        return path
    if fmt == "kaldi":
        folder = out / "kaldi"
        folder.mkdir(exist_ok=True)
        names = ["wav.scp", "text", "utt2spk", "utt2lang"] + (["utt2dur"] if durations else [])
        files = {name: open(folder / name, "w") for name in names}
        keyed = {"wav.scp": "audio", "text": "text", "utt2spk": "speaker", "utt2lang": "language",
                 "utt2dur": "duration"}
        for r in scaled(rows, n, durations):
            for name, f in files.items():
                value = str(r[keyed[name]]).replace(" ", "_") if name == "utt2spk" else r[keyed[name]]
                f.write(f"{r['id']} {value}\n")
        for f in files.values():
            f.close()
        return folder
    raise ValueError(f"unknown format {fmt}")


def measure(cmd: list[str], run_dir: Path, log: Path) -> dict:
    """Run `cmd`; start-up to step 1, peak RSS (GiB), wall seconds, and the last metrics row."""
    shutil.rmtree(run_dir, ignore_errors=True)
    metrics, first_written = run_dir / "metrics.jsonl", None
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        while True:  # wait4 rather than poll: the rusage of the process is its peak RSS
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if first_written is None and metrics.is_file() and metrics.stat().st_size > 0:
                first_written = metrics.stat().st_mtime  # when step 1's line was written
            time.sleep(0.02)
        proc.returncode = code = os.waitstatus_to_exitcode(status)
    wall = time.time() - start
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({code}); see {log}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    startup = first_written - rows[0]["time/step"] - start
    return {"startup": startup, "peak_gib": usage.ru_maxrss / 2**20, "wall": wall, "last": rows[-1]}


def size_of(path: Path) -> int:
    """Bytes of `path`, a file or a folder (0 when absent)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def cache_ram_gib(row: dict) -> float | None:
    """The cache's RAM from a metrics row, when the run logs it (`encoder/...gib` or `...bytes`)."""
    for key, value in row.items():
        if key.startswith("encoder/") and ("gib" in key or "ram" in key):
            return float(value)
        if key.startswith("encoder/") and "bytes" in key:
            return float(value) / 2**30
    return None


def bench_one(fmt: str, n: int, args, rows: list[dict]) -> dict:
    work = args.out / f"{fmt}_{n}"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    manifest = write_manifest(fmt, rows, n, work, not args.no_duration)
    print(f"[{fmt} {n}] wrote {manifest} in {time.perf_counter() - t0:.1f}s", flush=True)
    cache = args.out / f"cache_{fmt}_{n}"
    shutil.rmtree(cache, ignore_errors=True) if cache.is_dir() else cache.unlink(missing_ok=True)
    common = [f"pretrain={args.model}", f"train_manifest={manifest}", f"model.encoder_cache={cache}", *COMMON]
    out = {"format": fmt, "n": n}
    for algo, extra in (("sft", SFT), ("grpo", GRPO)):
        run_dir = work / algo
        m = measure([ASR_RL, "train", algo, *common, *extra, f"output_dir={run_dir}"], run_dir, work / f"{algo}.log")
        out[algo] = m
        print(f"[{fmt} {n}] {algo}: start-up {m['startup']:.1f}s, peak {m['peak_gib']:.3f} GiB, "
              f"wall {m['wall']:.0f}s", flush=True)
    out["cache_disk_mib"] = size_of(cache) / 2**20
    ram = cache_ram_gib(out["sft"]["last"])
    out["cache_ram_mib"] = None if ram is None else ram * 1024
    return out


def table(results: list[dict]) -> str:
    head = ("| format | utterances | SFT start-up s | SFT peak RSS GiB | GRPO start-up s | GRPO peak RSS GiB "
            "| cache disk MiB | cache RAM MiB |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in results:
        ram = "-" if r["cache_ram_mib"] is None else f"{r['cache_ram_mib']:.1f}"
        lines.append(f"| {r['format']} | {r['n']:,} | {r['sft']['startup']:.1f} | {r['sft']['peak_gib']:.3f} | "
                     f"{r['grpo']['startup']:.1f} | {r['grpo']['peak_gib']:.3f} | {r['cache_disk_mib']:.1f} | {ram} |")
    return "\n".join(lines)


def ratios(results: list[dict]) -> str:
    """Largest size over smallest, per format and run: start-up (target <= 3x) and peak RSS (<= 1.15x)."""
    lines = ["| format | run | start-up ratio (<= 3x) | peak RSS ratio (<= 1.15x) |", "|---|---|---:|---:|"]
    for fmt in dict.fromkeys(r["format"] for r in results):
        mine = sorted((r for r in results if r["format"] == fmt), key=lambda r: r["n"])
        if len(mine) < 2:
            continue
        lo, hi = mine[0], mine[-1]
        for algo in ("sft", "grpo"):
            s = hi[algo]["startup"] / lo[algo]["startup"]
            p = hi[algo]["peak_gib"] / lo[algo]["peak_gib"]
            lines.append(f"| {fmt} ({hi['n']:,} / {lo['n']:,}) | {algo} | {s:.2f}x {'ok' if s <= 3 else 'MISSED'} | "
                         f"{p:.3f}x {'ok' if p <= 1.15 else 'MISSED'} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, required=True, help="a folder from `asr-rl data synth` (train.jsonl)")
    p.add_argument("--model", type=Path, required=True, help="a folder from `asr-rl model init`")
    p.add_argument("--sizes", type=int, nargs="+", default=[3000, 30000, 300000])
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    p.add_argument("--no-duration", action="store_true", help="rows without `duration` (every header is opened)")
    p.add_argument("--out", type=Path, default=Path("/tmp/bench_data_scale"), help="work folder")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = base_rows(args.corpus)
    results = [bench_one(fmt, n, args, rows) for fmt in args.formats for n in sorted(args.sizes)]
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print("\n" + table(results) + "\n\n" + ratios(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
