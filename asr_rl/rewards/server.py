"""An HTTP reward server speaking OpenRLHF's remote reward protocol (docs/rewards.md).

`POST /get_reward` takes `{"query": [...], "prompts": [...], "labels": [...]}` (OpenRLHF's
`remote_rm_fn` body) and answers `{"rewards": [...], "scores": [...], "extra_logs": {...}}`.

Choices (DESIGN: "where it is silent, choose what an OpenRLHF user would expect"):
- scores: the reward's own scores; a reward without scores sends its rewards as scores, unclipped,
  as OpenRLHF's example servers do (`{"rewards": r, "scores": r}`). They lie in [0, 1] only when the
  rewards do.
- extra_logs: the mean of each term over the request (None values skipped) plus the reward's own
  `extra_logs`; non-finite values are left out, since JSON cannot carry them.
- extension: `terms`, each term's value per sample (null where it does not apply): our client logs
  the terms over the groups the step trains on, as a local reward's are (a request's means would
  also count the groups dynamic filtering drops).
- extension: our client also sends `"samples": [{Sample fields}]` (keywords as a list). When present,
  the `Sample`s are built from it exactly and the OpenRLHF lists are only checked for length. Without
  it, samples are rebuilt from the OpenRLHF fields (see `sample_from_query`), plus optional per-sample
  `language`, `keywords` and `context` (a context list per sample, for the `biasing` term) lists.
- one reward call at a time per server (a lock), because user rewards need not be thread-safe (a model
  on one GPU, a counter); scale out with several servers, which `RemoteReward` splits a batch across.
  Bodies are decoded and validated in worker threads, outside that lock and off the event loop.
- errors answer `{"error": "..."}`: 401 bad token, 400 invalid or too deeply nested JSON, 413 body too large, 415 not JSON,
  422 malformed fields, 500 when the reward raises or returns the wrong count or a non-finite value.
"""
from __future__ import annotations

import hmac
import json
import logging
import math
import os
import re
import sys
import threading
from dataclasses import fields

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from asr_rl.rewards.base import RewardError, RewardOutput, Sample, check_output

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
TOKEN_ENV = "ASR_RL_REWARD_TOKEN"
_ASSISTANT_TURN = "<|im_start|>assistant\n"
# Decoded OpenRLHF queries may keep the chat template's end tokens (`<|im_end|>`, `<|endoftext|>`);
# they are not part of the transcript and would count as insertions in CER.
_TRAILING_SPECIAL = re.compile(r"(?:\s*<\|[^|<>\s]*\|>)+\s*$")
_LIST_FIELDS = ("query", "prompts", "labels", "language", "keywords", "context", "samples")


class BadRequest(Exception):
    """A request the server refuses: an HTTP status and a message for the `error` field."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def reward_name(reward) -> str:
    """The reward's `name`, or its class name for a plain callable."""
    return getattr(reward, "name", None) or type(reward).__name__


def span(n: int, start: int = 0) -> str:
    """`sample 3` or `samples 0-7`: how errors name the samples they concern."""
    return f"sample {start}" if n == 1 else f"samples {start}-{start + n - 1}"


# ----------------------------------------------------------------------------- request -> samples
def _is_str(v) -> bool:
    return isinstance(v, str)


def _is_str_list(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# field -> (check, what the field must be); `None` is allowed where the Sample default is None.
_SAMPLE_CHECKS = {
    "hypothesis": (lambda v: isinstance(v, str), "a string"),
    "reference": (lambda v: v is None or isinstance(v, str), "a string, or null on an unlabelled line"),
    "language": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "keywords": (lambda v: v is None or _is_str_list(v), "a list of strings"),
    "prompt": (lambda v: isinstance(v, str), "a string"),
    "response": (lambda v: isinstance(v, str), "a string"),
    "predicted_language": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "well_formed": (lambda v: isinstance(v, bool), "true or false"),
    "duration": (lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
                 "a number or null"),
    "group_id": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "context": (lambda v: v is None or _is_str_list(v), "a list of strings"),
    "audio": (lambda v: v is None or isinstance(v, str), "a string (the audio's path) or null"),
    "metadata": (lambda v: v is None or isinstance(v, dict), "an object"),
}
assert set(_SAMPLE_CHECKS) == {f.name for f in fields(Sample)}, "keep _SAMPLE_CHECKS in step with Sample"


def sample_from_dict(d, i: int) -> Sample:
    """`samples[i]` (our client's extension) -> the exact `Sample`; 422 naming the bad field."""
    if not isinstance(d, dict):
        raise BadRequest(422, f"samples[{i}] must be an object with Sample fields, got {type(d).__name__}")
    unknown = sorted(set(d) - set(_SAMPLE_CHECKS))
    if unknown:
        raise BadRequest(422, f"samples[{i}] has unknown fields {unknown}; valid: {sorted(_SAMPLE_CHECKS)}")
    for key in ("hypothesis", "reference"):
        if key not in d:
            raise BadRequest(422, f"samples[{i}] lacks the required field {key!r}")
    for key, value in d.items():
        ok, what = _SAMPLE_CHECKS[key]
        if not ok(value):
            raise BadRequest(422, f"samples[{i}].{key} must be {what}, got {value!r}")
    kw = dict(d)
    kw["keywords"] = tuple(kw.get("keywords") or ())
    kw["context"] = tuple(kw.get("context") or ())
    kw["metadata"] = kw.get("metadata") or {}
    return Sample(**kw)


def _specs_by_format() -> list:
    """The model families, those whose output has a format of its own (a language tag) first: a
    plain family parses any text, so it only answers what no tagged family recognises."""
    from asr_rl.models.families import FAMILIES, AudioLLMSpec

    specs = [FAMILIES.get(name) for name in FAMILIES]
    return sorted(specs, key=lambda spec: type(spec).parse_output is AudioLLMSpec.parse_output)


def sample_from_query(query: str, prompt: str, label: str | None, language=None, keywords=None, context=None,
                      group_id: int = 0) -> Sample:
    """One OpenRLHF triple -> a Sample (`group_id`: its prompt's; parse_request numbers the prompts).

    hypothesis: the response (the query minus the prompt when it starts with it, or minus everything
    up to the last `<|im_start|>assistant` turn), trailing `<|...|>` end tokens dropped, read in the
    output format of the first model family that recognises it (Qwen3-ASR's
    `language English<asr_text>...`, Qwen2-Audio's `<|en|>...`), which also gives the predicted
    language; else the response as it is. well_formed stays True: without our extension the server
    cannot tell a text task (no format expected) from a malformed ASR answer.
    """
    response = query[len(prompt):] if prompt and query.startswith(prompt) else query
    response = _TRAILING_SPECIAL.sub("", response.rsplit(_ASSISTANT_TURN, 1)[-1])
    predicted, hypothesis = None, response
    for spec in _specs_by_format():
        tag, transcript, ok = spec.parse_output(response)
        if ok:
            predicted, hypothesis = tag, transcript
            break
    return Sample(hypothesis=hypothesis.strip(), reference=label, language=language, keywords=tuple(keywords or ()),
                  prompt=prompt, response=query, predicted_language=predicted, context=tuple(context or ()),
                  group_id=group_id)


def _check_items(name: str, values: list, allow_none: bool, ok, what: str) -> None:
    for i, v in enumerate(values):
        if not ((allow_none and v is None) or ok(v)):
            raise BadRequest(422, f"{name}[{i}] must be {what}, got {v!r}")


def parse_request(body) -> list[Sample]:
    """The JSON body -> one Sample per query; 422 naming the field for anything malformed."""
    if not isinstance(body, dict):
        raise BadRequest(422, f"the body must be a JSON object with a 'query' list, got {type(body).__name__}")
    lists = {k: body[k] for k in _LIST_FIELDS if body.get(k) is not None}
    for k, v in lists.items():
        if not isinstance(v, list):
            raise BadRequest(422, f"field {k!r} must be a list with one item per sample, got {type(v).__name__}")
    if "query" not in lists and "samples" not in lists:
        raise BadRequest(422, "missing field 'query': send {\"query\": [...], \"prompts\": [...], \"labels\": [...]}")
    first = "samples" if "samples" in lists else "query"
    n = len(lists[first])
    for k, v in lists.items():
        if len(v) != n:
            raise BadRequest(422, f"field {k!r} has {len(v)} items but {first!r} has {n}; "
                                  "every list needs one item per sample")
    if "samples" in lists:
        return [sample_from_dict(d, i) for i, d in enumerate(lists["samples"])]
    _check_items("query", lists["query"], False, _is_str, "a string")
    # OpenRLHF sends labels/prompts as None when the prompt set has none: an empty prompt, and a
    # missing label is an unlabelled sample (reference None: the terms that need one skip it).
    for k in ("prompts", "labels", "language"):
        _check_items(k, lists.get(k, []), True, _is_str, "a string or null")
    for k in ("keywords", "context"):
        _check_items(k, lists.get(k, []), True, _is_str_list, "a list of strings or null")
    cols = {k: lists.get(k, [None] * n) for k in ("prompts", "labels", "language", "keywords", "context")}
    # the samples of one prompt are one group (OpenRLHF sends n_samples_per_prompt of each): a term
    # that reads a sample's group (`consensus`) compares it with the request's samples of its prompt
    prompts = [p or "" for p in cols["prompts"]]
    group = {p: k for k, p in enumerate(dict.fromkeys(prompts))}
    return [sample_from_query(q, prompts[i], cols["labels"][i], cols["language"][i], cols["keywords"][i],
                              cols["context"][i], group[prompts[i]]) for i, q in enumerate(lists["query"])]


# ----------------------------------------------------------------------------- scoring
def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def score(reward, samples: list[Sample]) -> dict:
    """Run the reward and build the answer; RewardError naming the reward, samples and cause."""
    name, n = reward_name(reward), len(samples)
    try:
        out = reward(samples)
    except Exception as e:  # the client must see why, never a fake 0
        raise RewardError(f"reward {name!r} failed on {span(n)}: {type(e).__name__}: {e}") from e
    if not isinstance(out, RewardOutput):
        raise RewardError(f"reward {name!r} returned {type(out).__name__} for {span(n)}; expected RewardOutput")
    check_output(name, out, n)
    if out.scores is not None:
        for i, s in enumerate(out.scores):
            if not _finite(s):
                raise RewardError(f"reward {name!r} returned score {s!r} for sample {i}; scores must be finite")
    logs, terms = {}, {}
    for term, values in out.terms.items():
        vals = [v for v in values if v is not None]
        if vals and all(_finite(v) for v in vals):
            logs[term] = sum(vals) / len(vals)
            terms[term] = [None if v is None else float(v) for v in values]
    logs.update({k: float(v) for k, v in out.extra_logs.items() if _finite(v)})
    scores = out.rewards if out.scores is None else [float(s) for s in out.scores]
    return {"rewards": out.rewards, "scores": scores, "extra_logs": logs, "terms": terms}


# ----------------------------------------------------------------------------- HTTP
def _check_token(request: Request, token: str | None) -> None:
    if token is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    # compare_digest: the time taken does not reveal how much of the token matched.
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise BadRequest(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'")


async def _read_body(request: Request, limit: int) -> bytes:
    """The raw body: 415 unless JSON, 413 past `limit` bytes (also for chunked bodies)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise BadRequest(415, f"content type {media or 'none'!r} is not supported; "
                              "send JSON with 'Content-Type: application/json'")
    declared = request.headers.get("content-length", "")
    too_big = f"request body exceeds the server's limit of {limit} bytes (max_request_bytes)"
    if declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, too_big)
    body, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, too_big)
        body.append(chunk)
    return b"".join(body)


def _json(raw: bytes):
    """The body as JSON, 400 if invalid or nested past what the decoder recurses into."""
    try:
        return json.loads(raw)
    except ValueError as e:
        raise BadRequest(400, f"request body is not valid JSON: {e}") from None
    except RecursionError:  # a body of 100k `[`: a client's bug (or an attack), not the server's
        raise BadRequest(400, "request body nests arrays/objects too deeply to decode (Python's recursion limit, "
                              f"about {sys.getrecursionlimit()} levels); send a flat OpenRLHF body") from None


def create_app(reward, token: str | None = None, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> FastAPI:
    """A FastAPI app serving `reward` on `POST /get_reward` and `GET /health`.

    Args:
        reward: a callable `list[Sample] -> RewardOutput` with a `name` (the reward contract).
        token: when set (non-empty), every `/get_reward` call must send `Authorization: Bearer <token>`.
        max_request_bytes: bodies larger than this get 413 without being read in full.
    """
    name = reward_name(reward)
    token = token or None  # an empty token would accept `Authorization: Bearer ` from anyone
    lock = threading.Lock()
    app = FastAPI(title=f"asr-rl reward server ({name})")

    def run_reward(samples: list[Sample]) -> dict:
        with lock:
            return score(reward, samples)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "reward": name}

    @app.post("/get_reward")
    async def get_reward(request: Request):
        try:
            _check_token(request, token)
            raw = await _read_body(request, max_request_bytes)
            # Decoding and validating a large body takes seconds: in a worker thread and outside
            # the scoring lock, so the event loop and the other requests go on meanwhile.
            samples = await run_in_threadpool(lambda: parse_request(_json(raw)))
            if not samples:
                return {"rewards": [], "scores": [], "extra_logs": {}}
            # The reward is CPU- or GPU-bound sync code: keep the event loop free for /health.
            return await run_in_threadpool(run_reward, samples)
        except BadRequest as e:
            headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
            return JSONResponse({"error": e.message}, status_code=e.status, headers=headers)
        except RewardError as e:
            log.error("%s", e)
            return JSONResponse({"error": str(e)}, status_code=500)
        except Exception as e:  # a bug here must still answer with a cause, not a bare 500
            log.exception("reward server error")
            return JSONResponse({"error": f"reward server error: {type(e).__name__}: {e}"}, status_code=500)

    return app


def serve(reward_spec: str = "builtin:asr", host: str = "127.0.0.1", port: int = 5000, token: str | None = None,
          max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
    """Load `reward_spec` (`builtin:asr` or a user `.py` file) and serve it until interrupted.

    The token defaults to the `ASR_RL_REWARD_TOKEN` environment variable, which keeps it out of
    the process list. Binds 127.0.0.1 unless told otherwise.
    """
    import uvicorn

    from asr_rl.rewards.pipeline import load_reward_spec  # lazy: plugins may import user code

    token = (token if token is not None else os.environ.get(TOKEN_ENV)) or None  # "" means none
    reward = load_reward_spec(reward_spec)
    app = create_app(reward, token=token, max_request_bytes=max_request_bytes)
    if host in ("0.0.0.0", "::", "") and not token:
        log.warning("serving reward on %s:%d without a token: anyone who can reach this port can call it; "
                    "set --token or %s", host or "0.0.0.0", port, TOKEN_ENV)
    log.info("serving reward %r at http://%s:%d/get_reward", reward_name(reward), host, port)
    uvicorn.run(app, host=host, port=port, log_level="info")
