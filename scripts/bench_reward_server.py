"""Latency of the reward server under concurrent clients, on 127.0.0.1.

Usage:
    python scripts/bench_reward_server.py [--clients 16] [--requests 20] [--batch 32] [--reward builtin:asr]

Serves the reward with uvicorn in this process, then CLIENTS threads each send REQUESTS requests
of BATCH samples (OpenRLHF's /get_reward body; transcripts of the demo's command grammar) and check
that every answer has one reward per sample. Prints p50/p90/p99/max latency and the throughput;
then the latency of /health and of a small request while a ~7 MiB body is being parsed. Bounded in
count and time; touches nothing but 127.0.0.1.
"""
from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asr_rl.rewards.pipeline import load_reward_spec  # noqa: E402
from asr_rl.rewards.server import create_app  # noqa: E402

REFS = ["call anna on her mobile", "set a timer for ten minutes", "turn on the kitchen lights",
        "what is the weather in paris", "dial five five five one two three four"]


def serve(app) -> tuple[uvicorn.Server, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=sock.getsockname()[1], log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}"


def body(batch: int, salt: int) -> dict:
    refs = [REFS[(salt + i) % len(REFS)] for i in range(batch)]
    hyps = [r if (salt + i) % 3 else r.replace("a", "e") for i, r in enumerate(refs)]
    return {"query": [f"language English<asr_text>{h}" for h in hyps], "prompts": [""] * batch, "labels": refs}


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reward", default="builtin:asr")
    args = ap.parse_args()
    server, url = serve(create_app(load_reward_spec(args.reward), max_request_bytes=16 << 20))
    latencies, failures = [], []
    httpx.post(f"{url}/get_reward", json=body(args.batch, 0), timeout=60.0)  # warm-up: imports, first jiwer call

    def client(c: int) -> None:
        with httpx.Client(base_url=url, timeout=60.0) as http:
            for r in range(args.requests):
                t0 = time.perf_counter()
                resp = http.post("/get_reward", json=body(args.batch, c * 1000 + r))
                latencies.append(time.perf_counter() - t0)
                if resp.status_code != 200 or len(resp.json()["rewards"]) != args.batch:
                    failures.append(resp.text[:200])

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    wall = time.perf_counter() - start
    n = len(latencies)
    print(f"reward {args.reward}: {args.clients} clients x {args.requests} requests x {args.batch} samples, "
          f"{n} answered, {len(failures)} failed, {wall:.1f} s\n")
    print("| p50 ms | p90 ms | p99 ms | max ms | mean ms | requests/s | samples/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    ms = [x * 1000 for x in latencies]
    print(f"| {percentile(ms, 50):.1f} | {percentile(ms, 90):.1f} | {percentile(ms, 99):.1f} | {max(ms):.1f} | "
          f"{statistics.mean(ms):.1f} | {n / wall:.1f} | {n * args.batch / wall:.0f} |")

    big = body(1, 0)
    big = {k: v * 90000 for k, v in big.items()}  # ~7 MiB
    size = len(httpx.Request("POST", url, json=big).content)
    result = {}

    def send_big() -> None:
        t0 = time.perf_counter()
        with httpx.Client(base_url=url, timeout=300.0) as http:
            result["status"] = http.post("/get_reward", json=big).status_code
        result["big"] = time.perf_counter() - t0

    sender = threading.Thread(target=send_big, daemon=True)
    sender.start()
    time.sleep(0.5)
    with httpx.Client(base_url=url, timeout=300.0) as http:
        t0 = time.perf_counter()
        http.get("/health")
        health = time.perf_counter() - t0
        t0 = time.perf_counter()
        http.post("/get_reward", json=body(4, 7))
        small = time.perf_counter() - t0
    sender.join(300)
    print(f"\nwhile a {size / 2**20:.1f} MiB body ({result.get('big', float('nan')):.1f} s, status "
          f"{result.get('status')}) was parsed and scored: /health {health * 1000:.0f} ms, a 4-sample request "
          f"{small * 1000:.0f} ms")
    server.should_exit = True
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
