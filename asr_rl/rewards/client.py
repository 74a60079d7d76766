"""`RemoteReward`: the reward contract over HTTP, against one or more servers speaking OpenRLHF's
`/get_reward` protocol (ours in `asr_rl.rewards.server`, or any OpenRLHF-compatible one).

A batch is cut into contiguous chunks of whole groups (rewards/groups.py), dealt to the servers
round-robin, sent concurrently and reassembled in order. Each request carries OpenRLHF's fields
(query = response, prompts = prompt, labels = reference) plus our `samples` extension, so that our
server rebuilds the `Sample`s exactly.

Failures never turn into a silent 0: after bounded retries (connection errors, timeouts, 408, 429
and 5xx, with exponential backoff) or at once (other 4xx, a malformed answer) it raises `RewardError`
naming the URL, the sample indices of the batch and the cause.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from asr_rl.rewards.base import RewardError, RewardOutput, Sample
from asr_rl.rewards.groups import group_chunks

log = logging.getLogger(__name__)

TOKEN_ENV = "ASR_RL_REWARD_TOKEN"
RETRIED_STATUS = frozenset({408, 429})  # plus every 5xx
MAX_THREADS = 32
_HINTS = {
    401: "set the same token on client and server (reward token / ASR_RL_REWARD_TOKEN)",
    413: "send fewer samples per request (chunk_size) or raise the server's max_request_bytes",
    404: "check the URL: the endpoint is /get_reward",
}


def endpoints(urls: list[str] | str) -> list[str]:
    """`"http://a:5000,http://b:5000/get_reward"` -> full `/get_reward` URLs, one per server."""
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    out = []
    for u in (u.strip().rstrip("/") for u in items):
        if not u:
            continue
        if not u.startswith(("http://", "https://")):
            raise ValueError(f"reward server URL {u!r} has no http:// or https:// scheme: add http:// "
                             f"(http://{u})")
        out.append(u if u.endswith("/get_reward") else u + "/get_reward")
    if not out:
        raise ValueError(f"no reward server URL in {urls!r}; give e.g. http://127.0.0.1:5000")
    return out


def request_body(samples: list[Sample]) -> bytes:
    """OpenRLHF's fields plus the `samples` extension, as JSON bytes.

    Metadata values that JSON cannot hold are sent as strings (manifest metadata is JSON already).
    """
    payload = {
        "query": [s.response for s in samples],
        "prompts": [s.prompt for s in samples],
        "labels": [s.reference for s in samples],
        "samples": [{**dataclasses.asdict(s), "keywords": list(s.keywords)} for s in samples],
    }
    return json.dumps(payload, ensure_ascii=False, default=str).encode("utf-8")


def _error_text(resp: httpx.Response) -> str:
    """The server's `error` message, or the start of its body."""
    try:
        data = resp.json()
        if isinstance(data, dict) and "error" in data:
            return str(data["error"])
    except ValueError:
        pass
    return resp.text[:300] or resp.reason_phrase


class RemoteReward:
    """The reward contract served by remote `/get_reward` servers.

    Args:
        urls: servers as a list or comma-separated string; `http://host:port` gets `/get_reward` appended.
        token: bearer token; defaults to the `ASR_RL_REWARD_TOKEN` environment variable.
        timeout: seconds per request (connect, read and write each).
        max_retries: attempts per chunk in all, the first included (OpenRLHF's `try_max_times`).
        backoff: seconds before the 2nd attempt; doubled for each further one.
        chunk_size: samples per request; default: one contiguous chunk per server.
    """

    name = "remote"

    def __init__(self, urls: list[str] | str, token: str | None = None, timeout: float = 30.0,
                 max_retries: int = 3, backoff: float = 0.5, chunk_size: int | None = None):
        if max_retries < 1:
            raise ValueError(f"max_retries must be >= 1 (attempts in all), got {max_retries}")
        if timeout <= 0 or backoff < 0:
            raise ValueError(f"timeout must be > 0 and backoff >= 0, got timeout={timeout}, backoff={backoff}")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.urls = endpoints(urls)
        self.token = (token if token is not None else os.environ.get(TOKEN_ENV)) or None
        self.timeout, self.max_retries, self.backoff, self.chunk_size = timeout, max_retries, backoff, chunk_size
        self._http: httpx.Client | None = None

    # An httpx.Client cannot be pickled: create it lazily so the reward can be shipped to Ray workers.
    def __getstate__(self) -> dict:
        return {**self.__dict__, "_http": None}

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            headers = {"Content-Type": "application/json"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            self._http = httpx.Client(timeout=self.timeout, headers=headers)
        return self._http

    def close(self) -> None:
        """Close pooled connections; the next call opens new ones."""
        if self._http is not None:
            self._http.close()
            self._http = None

    def chunks(self, samples: list[Sample]) -> list[tuple[int, int, str]]:
        """`(start, end, url)` per request: contiguous slices of whole groups (about `chunk_size`
        samples, a group never split: a term such as `consensus` reads it whole), servers taken
        round-robin."""
        cuts = group_chunks([s.group_id for s in samples], parts=len(self.urls), size=self.chunk_size)
        return [(a, b, self.urls[k % len(self.urls)]) for k, (a, b) in enumerate(cuts)]

    def __call__(self, samples: list[Sample]) -> RewardOutput:
        """Score `samples` remotely; RewardError naming URL, samples and cause on any failure."""
        if not samples:
            return RewardOutput(rewards=[], scores=[])
        parts = self.chunks(samples)
        http = self.http  # create before the threads do, so that they share one pool
        with ThreadPoolExecutor(max_workers=min(len(parts), MAX_THREADS)) as pool:
            futures = [pool.submit(self._post, http, url, samples[a:b], a) for a, b, url in parts]
            try:
                answers = [f.result() for f in futures]
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise
        rewards = [r for a in answers for r in a["rewards"]]
        all_scores = [a["scores"] for a in answers]
        scores = None if any(s is None for s in all_scores) else [s for part in all_scores for s in part]
        # per-sample terms (our servers send them) are logged as a local reward's; the request means
        # of the same terms are then left out of the extra logs
        names = set.intersection(*[set(a["terms"]) for a in answers])
        terms = {k: [v for a in answers for v in a["terms"][k]] for k in sorted(names)}
        logs = {k: v for k, v in _mean_logs(answers, [b - a for a, b, _ in parts]).items() if k not in terms}
        return RewardOutput(rewards=rewards, scores=scores, terms=terms, extra_logs=logs)

    def _post(self, http: httpx.Client, url: str, samples: list[Sample], start: int) -> dict:
        """One chunk, with retries; returns the checked answer."""
        where = f"reward server {url} failed for {_span(start, len(samples))}"
        body, cause = request_body(samples), ""
        for attempt in range(1, self.max_retries + 1):
            try:
                resp = http.post(url, content=body)
            except httpx.TimeoutException as e:
                cause = f"timed out after {self.timeout}s ({type(e).__name__})"
            except httpx.TransportError as e:
                cause = f"{type(e).__name__}: {e}".rstrip(": ")
            else:
                if resp.status_code < 400:
                    return parse_answer(resp, url, start, len(samples))
                cause = f"HTTP {resp.status_code}: {_error_text(resp)}"
                if resp.status_code < 500 and resp.status_code not in RETRIED_STATUS:
                    hint = _HINTS.get(resp.status_code)
                    raise RewardError(f"{where} (not retried): {cause}" + (f"; {hint}" if hint else ""))
            if attempt < self.max_retries:
                delay = self.backoff * 2 ** (attempt - 1)
                log.warning("%s (attempt %d/%d): %s; retrying in %.2fs", where, attempt, self.max_retries,
                            cause, delay)
                time.sleep(delay)
        raise RewardError(f"{where} after {self.max_retries} attempts: {cause}")


def _span(start: int, n: int) -> str:
    return f"sample {start}" if n == 1 else f"samples {start}-{start + n - 1}"


def _numbers(values, field: str, url: str, start: int, n: int) -> list[float]:
    """A list of `n` finite numbers, or RewardError naming the first bad sample."""
    if not isinstance(values, list):
        raise RewardError(f"reward server {url} answered {field!r} as {type(values).__name__} for "
                          f"{_span(start, n)}; expected a list of numbers")
    if len(values) != n:
        raise RewardError(f"reward server {url} answered {len(values)} {field} for {_span(start, n)} "
                          f"({n} samples); expected one per sample")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise RewardError(f"reward server {url} answered {field}[{i}] = {v!r} for sample {start + i}; "
                              "expected a finite number")
    return [float(v) for v in values]


def parse_answer(resp: httpx.Response, url: str, start: int, n: int) -> dict:
    """A 2xx answer -> `{"rewards", "scores" (or None), "extra_logs"}`, checked."""
    try:
        data = resp.json()
    except ValueError as e:
        raise RewardError(f"reward server {url} answered malformed JSON for {_span(start, n)}: {e}; "
                          f"body starts {resp.text[:80]!r}") from None
    if not isinstance(data, dict) or "rewards" not in data:
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise RewardError(f"reward server {url} answered without 'rewards' for {_span(start, n)} (got {got})")
    scores = data.get("scores")
    logs = data.get("extra_logs")
    terms = data.get("terms")
    return {"rewards": _numbers(data["rewards"], "rewards", url, start, n),
            "scores": None if scores is None else _numbers(scores, "scores", url, start, n),
            "extra_logs": logs if isinstance(logs, dict) else {},
            "terms": _terms(terms, url, start, n) if isinstance(terms, dict) else {}}


def _terms(terms: dict, url: str, start: int, n: int) -> dict[str, list[float | None]]:
    """The answer's per-sample terms (our extension): `n` finite numbers or nulls each."""
    out = {}
    for name, values in terms.items():
        if not isinstance(values, list) or len(values) != n:
            raise RewardError(f"reward server {url} answered term {name!r} for {_span(start, n)} with "
                              f"{len(values) if isinstance(values, list) else type(values).__name__} values; expected {n}")
        present = [v for v in values if v is not None]
        _numbers(present, f"terms.{name}", url, start, len(present))
        out[str(name)] = [None if v is None else float(v) for v in values]
    return out


def _mean_logs(answers: list[dict], sizes: list[int]) -> dict[str, float]:
    """Each numeric extra_log averaged over the chunks that sent it, weighted by chunk size
    (each chunk's value is already a mean over its samples)."""
    total: dict[str, float] = {}
    weight: dict[str, int] = {}
    for answer, n in zip(answers, sizes):
        for k, v in answer["extra_logs"].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                total[k] = total.get(k, 0.0) + v * n
                weight[k] = weight.get(k, 0) + n
    return {k: total[k] / weight[k] for k in total}
