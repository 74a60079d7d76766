"""The reward server under load, on 127.0.0.1: 16 concurrent clients, a bounded number of requests
and a bounded time; no request is dropped or answered with another request's rewards, and a large
body is parsed off the event loop and outside the scoring lock."""
from __future__ import annotations

import threading
import time

import httpx

from asr_rl.rewards.base import RewardOutput
from asr_rl.rewards.server import create_app
from tests.rewards.test_remote import running

CLIENTS, REQUESTS, BATCH = 16, 5, 4


class Length:
    """reward = len(hypothesis): every sample's answer says which request it belongs to."""

    name = "length"

    def __call__(self, samples):
        return RewardOutput([float(len(s.hypothesis)) for s in samples])


def _body(lengths: list[int]) -> dict:
    return {"query": ["x" * n for n in lengths], "prompts": [""] * len(lengths), "labels": [""] * len(lengths)}


def test_sixteen_concurrent_clients_get_their_own_rewards():
    answers: dict[tuple[int, int], list[float]] = {}
    errors: list[str] = []

    def client(c: int, url: str) -> None:
        with httpx.Client(base_url=url, timeout=30.0) as http:
            for r in range(REQUESTS):
                lengths = [1000 * c + 10 * r + j + 1 for j in range(BATCH)]
                resp = http.post("/get_reward", json=_body(lengths))
                if resp.status_code != 200:
                    errors.append(f"client {c} request {r}: {resp.status_code} {resp.text}")
                    continue
                answers[(c, r)] = resp.json()["rewards"]

    with running(create_app(Length())) as url:
        threads = [threading.Thread(target=client, args=(c, url), daemon=True) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in threads), "clients still waiting after 120 s"
    assert not errors, errors[:3]
    assert len(answers) == CLIENTS * REQUESTS  # none dropped
    for (c, r), rewards in answers.items():  # none mixed up
        assert rewards == [float(1000 * c + 10 * r + j + 1) for j in range(BATCH)]


def test_a_large_body_does_not_hold_up_small_requests(monkeypatch):
    # A large body takes a while to decode and validate (a 7 MiB one: seconds); made slow on purpose
    # here (2 s), so the ordering does not depend on the machine's load. It runs in a worker
    # thread, outside the scoring lock: /health and small requests are answered meanwhile.
    import asr_rl.rewards.server as server

    parse = server.parse_request

    def slow_for_large(body):
        if len(body.get("query", [])) > 100:
            time.sleep(2.0)
        return parse(body)

    monkeypatch.setattr(server, "parse_request", slow_for_large)
    done: dict[str, float] = {}
    with running(create_app(Length(), max_request_bytes=16 << 20)) as url:
        def send_big() -> None:
            with httpx.Client(base_url=url, timeout=120.0) as http:
                assert http.post("/get_reward", json=_body([400] * 1000)).json()["rewards"] == [400.0] * 1000
            done["big"] = time.monotonic()

        sender = threading.Thread(target=send_big, daemon=True)
        sender.start()
        with httpx.Client(base_url=url, timeout=60.0) as http:
            time.sleep(0.5)  # the big body is being parsed
            start = time.monotonic()
            small = http.post("/get_reward", json=_body([3, 5]))
            done["small"] = time.monotonic()
            assert small.json()["rewards"] == [3.0, 5.0]
            assert http.get("/health").status_code == 200
        sender.join(120)
    assert not sender.is_alive() and done["small"] < done["big"]
    assert done["small"] - start < 1.0  # not queued behind the 2 s parse
