"""The reward server and `RemoteReward` against real uvicorn servers on 127.0.0.1 (no HTTP mocks)."""
from __future__ import annotations

import logging
import math
import pickle
import re
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from asr_rl.rewards.base import RewardError, RewardOutput, Sample
from asr_rl.rewards.client import RemoteReward
from asr_rl.rewards.combine import WeightedReward
from asr_rl.rewards.server import create_app, serve

# Short backoff so that every fault test ends in well under a second; a generous timeout, because training
# jobs share the 2 CPU cores (only test_slow_reward_times_out relies on the timeout, with its own).
FAST = {"timeout": 5.0, "max_retries": 2, "backoff": 0.01}


@pytest.fixture(autouse=True)
def _no_env_token(monkeypatch):
    monkeypatch.delenv("ASR_RL_REWARD_TOKEN", raising=False)


@contextmanager
def running(app):
    """Serve `app` with uvicorn in a thread on a free port; yields `http://127.0.0.1:PORT`."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # handing uvicorn the bound socket avoids a free-port race
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(5)
        sock.close()


class Recorder:
    """reward = len(hypothesis); remembers every batch it saw."""

    name = "recorder"

    def __init__(self):
        self.batches: list[list[Sample]] = []

    def __call__(self, samples):
        self.batches.append(list(samples))
        return RewardOutput(rewards=[float(len(s.hypothesis)) for s in samples], extra_logs={"calls": 1.0})


class Flaky:
    """Raises on the first `fails` calls, then gives 0.5 per sample."""

    name = "flaky"

    def __init__(self, fails: int):
        self.fails, self.calls = fails, 0

    def __call__(self, samples):
        self.calls += 1
        if self.calls <= self.fails:
            raise ValueError("model not loaded yet")
        return RewardOutput(rewards=[0.5] * len(samples))


def two_samples():
    return [Sample("call ana", "call anna", language="en", keywords=("anna",), response="call ana"),
            Sample("call anna", "call anna", language="en", response="call anna")]


# ----------------------------------------------------------------------------- happy paths
def test_cer_reward_through_remote():
    samples = two_samples()
    with running(create_app(WeightedReward({"cer": 1.0}))) as url:
        assert httpx.get(url + "/health").json() == {"status": "ok", "reward": "builtin"}
        remote = RemoteReward(url, **FAST)
        out = remote(samples)
        # a pickled copy (what Ray ships to workers) opens its own connections
        assert pickle.loads(pickle.dumps(remote))(samples).rewards == out.rewards
        assert remote([]).rewards == [] and httpx.post(url + "/get_reward", json={"query": []}).json()["rewards"] == []
    # one deleted 'n' out of the 9 characters of "call anna"
    assert out.rewards == pytest.approx([1 - 1 / 9, 1.0])
    assert out.scores == pytest.approx([1 - 1 / 9, 1.0])  # no scores from the reward: rewards are sent
    # the terms per sample (our extension), as the local reward gives them; no request mean beside them
    assert out.terms == {"cer": pytest.approx([1 - 1 / 9, 1.0])} and out.extra_logs == {}


def test_samples_extension_rebuilds_samples_exactly():
    samples = [Sample("call ana", "call anna", language="en", keywords=("anna", "call"), prompt="utt1",
                      response="language English<asr_text>call ana", predicted_language="English",
                      well_formed=False, duration=1.5, group_id=3, metadata={"speaker": "s1"})]
    rec = Recorder()
    with running(create_app(rec)) as url:
        RemoteReward(url + "/get_reward", **FAST)(samples)
    [[got]] = rec.batches
    assert got == samples[0] and got.metadata == {"speaker": "s1"}


def test_openrlhf_request_without_samples():
    rec = Recorder()
    body = {"query": ["<|im_start|>assistant\nlanguage English<asr_text>call anna<|im_end|>",
                      "Transcribe: call ana", "call anna"],
            "prompts": ["<|im_start|>assistant\n", "Transcribe: ", None],
            "labels": ["call anna", "call anna", "call anna"],
            "language": ["en", None, "en"], "keywords": [["anna"], None, []]}
    with running(create_app(WeightedReward({"cer": 1.0}))) as url, running(create_app(rec)) as url2:
        answer = httpx.post(url + "/get_reward", json=body).json()
        httpx.post(url2 + "/get_reward", json=body).raise_for_status()
    assert answer["rewards"] == pytest.approx([1.0, 1 - 1 / 9, 1.0])
    assert answer["scores"] == answer["rewards"]
    a, b, c = rec.batches[0]
    assert (a.hypothesis, a.predicted_language, a.language, a.keywords) == ("call anna", "English", "en", ("anna",))
    assert (b.hypothesis, b.prompt, b.language, b.keywords) == ("call ana", "Transcribe: ", None, ())
    assert (c.hypothesis, c.prompt, c.reference) == ("call anna", "", "call anna")


def test_batch_split_across_two_servers_keeps_order():
    rec_a, rec_b = Recorder(), Recorder()
    samples = [Sample("x" * i, "ref", group_id=i) for i in range(10)]  # groups of one: cut anywhere
    with running(create_app(rec_a)) as a, running(create_app(rec_b)) as b:
        out = RemoteReward(f"{a}, {b}/get_reward", chunk_size=3, **FAST)(samples)
        default = RemoteReward([a, b], **FAST)(samples)  # one chunk per server
    assert out.rewards == [float(i) for i in range(10)] == default.rewards

    def lengths(rec):
        return [[len(s.hypothesis) for s in batch] for batch in rec.batches]

    # chunks 0-2, 6-8 and then 0-4 went to a; 3-5, 9 and then 5-9 to b (round-robin by chunk)
    assert sorted(lengths(rec_a)) == [[0, 1, 2], [0, 1, 2, 3, 4], [6, 7, 8]]
    assert sorted(lengths(rec_b)) == [[3, 4, 5], [5, 6, 7, 8, 9], [9]]
    assert out.extra_logs == {"calls": 1.0}


def test_a_group_reading_term_gets_whole_groups_from_the_client_and_from_openrlhf_triples():
    """consensus over two servers, 3 samples a request asked for, groups of 4: every request holds
    whole groups and the rewards equal the local ones; OpenRLHF's triples are grouped by prompt."""
    texts = ["call anna", "call ana", "call anna", "call bob", "打开灯", "打开灯", "打开门", "打开灯"]
    samples = [Sample(t, None, group_id=i // 4, prompt=f"u{i // 4}") for i, t in enumerate(texts)]
    local = WeightedReward({"consensus": 1.0})
    rec_a, rec_b = Recorder(), Recorder()
    with running(create_app(local)) as a, running(create_app(rec_a)) as ra, running(create_app(rec_b)) as rb:
        remote = RemoteReward(f"{a}, {a}/get_reward", chunk_size=3, **FAST)(samples)
        RemoteReward([ra, rb], chunk_size=3, **FAST)(samples)
        body = {"query": [f"P{i // 4} {t}" for i, t in enumerate(texts)], "prompts": [f"P{i // 4} " for i in range(8)]}
        triples = httpx.post(a + "/get_reward", json=body).json()
    want = local(samples).rewards
    assert remote.rewards == pytest.approx(want) and triples["rewards"] == pytest.approx(want)
    assert [[s.group_id for s in batch] for batch in rec_a.batches + rec_b.batches] == [[0] * 4, [1] * 4]


# ----------------------------------------------------------------------------- faults
def test_server_down_names_url_samples_and_cause():
    with socket.socket() as dead:  # bound but not listening: connection refused
        dead.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{dead.getsockname()[1]}/get_reward"
        with pytest.raises(RewardError) as e:
            RemoteReward(url, **FAST)(two_samples())
    msg = str(e.value)
    assert f"reward server {url} failed for samples 0-1 after 2 attempts" in msg
    assert "refused" in msg.lower() or "ConnectError" in msg


def test_slow_reward_times_out():
    release = threading.Event()

    class Slow:
        name = "slow"

        def __call__(self, samples):
            release.wait(5)
            return RewardOutput(rewards=[1.0] * len(samples))

    with running(create_app(Slow())) as url:
        t0 = time.monotonic()
        with pytest.raises(RewardError, match=re.escape(f"{url}/get_reward failed for samples 0-1 after 2 "
                                                        "attempts: timed out after 0.3s")):
            RemoteReward(url, timeout=0.3, max_retries=2, backoff=0.01)(two_samples())
        assert time.monotonic() - t0 < 2
        release.set()


def test_500_then_success_is_retried():
    flaky = Flaky(fails=1)
    with running(create_app(flaky)) as url:
        out = RemoteReward(url, **FAST)(two_samples())
    assert out.rewards == [0.5, 0.5] and flaky.calls == 2


def test_reward_that_keeps_raising_reports_server_error():
    with running(create_app(Flaky(fails=99))) as url:
        resp = httpx.post(url + "/get_reward", json={"query": ["a", "b"], "labels": ["a", "b"]})
        assert resp.status_code == 500
        assert resp.json() == {"error": "reward 'flaky' failed on samples 0-1: ValueError: model not loaded yet"}
        samples = [Sample("a", "a", group_id=i) for i in range(5)]
        with pytest.raises(RewardError) as e:
            RemoteReward(url, chunk_size=4, **FAST)(samples)
    # the first failing chunk is reported, with the server's cause
    assert str(e.value) == (f"reward server {url}/get_reward failed for samples 0-3 after 2 attempts: HTTP 500: "
                            "reward 'flaky' failed on samples 0-3: ValueError: model not loaded yet")


@pytest.mark.parametrize("rewards, cause", [
    (lambda n: [1.0] * (n - 1), "reward 'bad' returned 1 rewards for 2 samples"),
    (lambda n: [1.0, math.nan], "reward 'bad' returned nan for sample 1"),
])
def test_reward_wrong_count_or_nan_is_500(rewards, cause):
    class Bad:
        name = "bad"

        def __call__(self, samples):
            return RewardOutput(rewards=rewards(len(samples)))

    with running(create_app(Bad())) as url:
        with pytest.raises(RewardError) as e:
            RemoteReward(url, **FAST)(two_samples())
    assert f"{url}/get_reward failed for samples 0-1 after 2 attempts: HTTP 500: {cause}" in str(e.value)


def fake_server(body: bytes, media_type: str = "application/json") -> Starlette:
    """A server answering `body` to every `/get_reward` call (for malformed answers)."""
    async def answer(request):
        return Response(body, media_type=media_type)
    return Starlette(routes=[Route("/get_reward", answer, methods=["POST"])])


@pytest.mark.parametrize("body, media_type, cause", [
    (b"<html>oops</html>", "text/html", "answered malformed JSON for samples 0-1"),
    (b'{"scores": [1, 1]}', "application/json", "answered without 'rewards' for samples 0-1 (got ['scores'])"),
    (b'{"rewards": [1.0]}', "application/json", "answered 1 rewards for samples 0-1 (2 samples)"),
    (b'{"rewards": [1.0, "high"]}', "application/json", "answered rewards[1] = 'high' for sample 1"),
    (b'{"rewards": [NaN, 1.0]}', "application/json", "answered rewards[0] = nan for sample 0"),
    (b'{"rewards": [1.0, 1.0], "scores": [1.0]}', "application/json", "answered 1 scores for samples 0-1"),
])
def test_malformed_answers(body, media_type, cause):
    with running(fake_server(body, media_type)) as url:
        with pytest.raises(RewardError) as e:
            RemoteReward(url, **FAST)(two_samples())
    assert f"reward server {url}/get_reward {cause}" in str(e.value)


def test_token_required():
    flaky = Flaky(fails=0)
    with running(create_app(flaky, token="s3cret")) as url:
        for token in (None, "wrong"):
            with pytest.raises(RewardError) as e:
                RemoteReward(url, token=token, **FAST)(two_samples())
            msg = str(e.value)
            assert f"reward server {url}/get_reward failed for samples 0-1 (not retried): HTTP 401" in msg
            assert "bearer token" in msg
        assert httpx.post(url + "/get_reward", json={"query": ["a"]},
                          headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert flaky.calls == 0  # refused before the reward ran
        assert RemoteReward(url, token="s3cret", **FAST)(two_samples()).rewards == [0.5, 0.5]


def test_oversized_request_is_413():
    flaky = Flaky(fails=0)
    with running(create_app(flaky, max_request_bytes=300)) as url:
        with pytest.raises(RewardError) as e:
            RemoteReward(url, **FAST)(two_samples())
        assert (f"reward server {url}/get_reward failed for samples 0-1 (not retried): HTTP 413: request body "
                "exceeds the server's limit of 300 bytes (max_request_bytes); send fewer samples") in str(e.value)
        # a chunked body (no Content-Length) is cut off while it streams
        chunked = httpx.post(url + "/get_reward", content=iter([b'{"query": ["' + b"a" * 200, b"a" * 200 + b'"]}']),
                             headers={"Content-Type": "application/json"})
        assert chunked.status_code == 413
    assert flaky.calls == 0


def test_bad_requests_are_refused():
    with running(create_app(Flaky(fails=0))) as url:
        def post(**kw):
            return httpx.post(url + "/get_reward", **kw)

        resp = post(content=b"query=a", headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert resp.status_code == 415 and "application/json" in resp.json()["error"]
        resp = post(content=b"{not json", headers={"Content-Type": "application/json"})
        assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]
        resp = post(json={"query": ["a", "b"], "prompts": ["", ""], "labels": ["a"]})
        assert resp.status_code == 422
        assert resp.json()["error"] == ("field 'labels' has 1 items but 'query' has 2; "
                                        "every list needs one item per sample")
        resp = post(json={"query": ["a"], "samples": [{"hypothesis": "a", "reference": 3}]})
        assert resp.status_code == 422 and resp.json()["error"] == "samples[0].reference must be a string, or null on an unlabelled line, got 3"
        assert post(json={"prompts": ["a"]}).status_code == 422


def test_json_nested_too_deep_to_decode_is_a_400_not_a_500(caplog):
    flaky = Flaky(fails=0)
    deep = b'{"query": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # 200 KB, under the size limit
    with running(create_app(flaky)) as url, caplog.at_level(logging.ERROR):
        resp = httpx.post(url + "/get_reward", content=deep, headers={"Content-Type": "application/json"}, timeout=30)
    assert resp.status_code == 400
    assert re.fullmatch(r"request body nests arrays/objects too deeply to decode \(Python's recursion limit, about "
                        r"\d+ levels\); send a flat OpenRLHF body", resp.json()["error"])
    assert flaky.calls == 0 and "RecursionError" not in caplog.text


def test_serve_loads_the_spec_and_warns_on_an_open_bind(monkeypatch, caplog):
    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw)))  # serve() blocks otherwise
    monkeypatch.setenv("ASR_RL_REWARD_TOKEN", "from-env")
    with caplog.at_level(logging.WARNING, logger="asr_rl.rewards.server"):
        serve("builtin:cer", host="127.0.0.1", port=5001)
        assert not caplog.records
        serve("builtin:cer", host="0.0.0.0", port=5002, token="")
    assert "without a token" in caplog.text
    (app, kw), _ = calls
    assert (kw["host"], kw["port"]) == ("127.0.0.1", 5001)
    with running(app) as url:  # the token came from the environment
        assert httpx.post(url + "/get_reward", json={"query": ["a"]}).status_code == 401
        out = RemoteReward(url, token="from-env", **FAST)([Sample("call ana", "call anna")])
    assert out.rewards == pytest.approx([1 - 1 / 9])


def test_openrlhf_queries_are_read_in_each_family_s_output_format():
    from asr_rl.rewards.server import sample_from_query

    qwen2_audio = sample_from_query("<|im_start|>assistant\n<|zh|>打开灯<|im_end|>", "", "打开灯", "zh")
    assert (qwen2_audio.hypothesis, qwen2_audio.predicted_language) == ("打开灯", "zh")
    qwen3_asr = sample_from_query("prompt language English<asr_text>call anna<|im_end|>", "prompt ", "call anna")
    assert (qwen3_asr.hypothesis, qwen3_asr.predicted_language) == ("call anna", "English")
    plain = sample_from_query("call <anna>", "", "call anna")
    assert (plain.hypothesis, plain.predicted_language) == ("call <anna>", None)


def test_the_biasing_term_scores_the_same_remotely_with_the_context_as_a_label_field():
    ctx = ("grace", "ben")
    samples = [Sample("call grace", "call grace", language="en", context=ctx, response="call grace"),
               Sample("call ben", "call grace", language="en", context=ctx, response="call ben"),
               Sample("call mom", "call mom", language="en", response="call mom")]
    local = WeightedReward({"biasing": 1.0})(samples).rewards
    assert local == [1.0, -1.0, 1.0]
    rec = Recorder()
    with running(create_app(WeightedReward({"biasing": 1.0}))) as url, running(create_app(rec)) as url2:
        # our client: the samples extension carries the context
        assert RemoteReward(url, **FAST)(samples).rewards == local
        RemoteReward(url2, **FAST)(samples)
        # an OpenRLHF-style body: `context` is a per-sample label field, like `keywords`
        body = {"query": [s.response for s in samples], "labels": [s.reference for s in samples],
                "context": [list(s.context) or None for s in samples]}
        assert httpx.post(url + "/get_reward", json=body).json()["rewards"] == local
        bad = httpx.post(url + "/get_reward", json={**body, "context": [["grace", 3], None, None]})
    assert rec.batches[0][1].context == ctx
    assert bad.status_code == 422 and "context[0] must be a list of strings or null" in bad.json()["error"]


def test_terms_that_do_not_apply_everywhere_log_the_same_remotely_and_locally():
    """A term that is None on some samples (unlabelled ones) and a batch split over two servers: the
    client's per-sample terms equal the local reward's, so the loop's means over the groups it keeps
    are the same (a request's mean would weigh the chunks by size and count filtered groups)."""
    local = WeightedReward({"cer": 1.0, "repetition": 0.5})
    samples = [Sample("call anna", "call anna", "en"), Sample("call bob call bob call bob", None, "en"),
               Sample("call ana", "call anna", "en"), Sample("x", None, "en"), Sample("call", "call anna", "en")]
    with running(create_app(local)) as a, running(create_app(local)) as b:
        out = RemoteReward(f"{a},{b}", **FAST)(samples)
    ref = local(samples)
    assert out.terms == ref.terms and out.rewards == pytest.approx(ref.rewards)
    assert ref.terms["cer"][1] is None and out.extra_logs == {}
