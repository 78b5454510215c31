"""The `vllm-served` re-scorer against a stand-in vLLM server over loopback HTTP (tests/doubles/vllm_scorer.py):
the rows it writes (the logprob of each completion token read from `prompt_logprobs` of the stored ids, one request
per rollout chain), idempotence, a run stopped by a failing engine resuming, the errors, the proxy's replicas, and
`openforge rescore --engine`. The real engine: tests/slow/test_rescore.py."""

from __future__ import annotations

import json

import pytest

from forge_store import open_store, rescores
from learner import RescoreError, rescore
from tests.conftest import make_call
from tests.doubles.vllm_scorer import PromptLogprobServer, logprob

P0 = [1, 5, 9, 14]
C0 = [20, 21, 2]
P1 = [*P0, *C0, 30, 31]          # the next turn extends the first: prompt + completion + the new message
C1 = [40, 2]
CALLS = {"a0": ("ra", 0, P0, C0), "a1": ("ra", 1, P1, C1), "b0": ("rb", 0, [3, 4, 5], [6, 7]),
         "b1": ("rb", 1, [3, 4, 99], [8])}   # b1 does not extend b0: a request of its own


def expected(prompt: list[int], completion: list[int]) -> list[float]:
    ids = prompt + completion
    return [logprob(ids[t - 1], ids[t]) for t in range(len(prompt), len(ids))]


@pytest.fixture
def store(store_url, settings):
    with open_store(store_url, settings=settings) as st:
        st.register_policy_version("v0", model_name="m", global_step=0, checkpoint_hash="abc")
        st.register_policy_version("v1", model_name="m", global_step=1)
        for rid in ("ra", "rb"):
            st.start_rollout(rid, policy_version_id="v0")
        for cid, (rid, turn, p, c) in CALLS.items():
            rec = make_call(cid, rid, turn, prompt_ids=p, completion_ids=c)
            rec.policy_version_id = "v0"
            st.record_call(rec)
        for rid in ("ra", "rb"):
            st.finish_rollout(rid, "success")
        yield st


@pytest.fixture
def sqlite_store(tmp_path, settings):
    with open_store(f"sqlite:///{tmp_path / 'one.sqlite'}", settings=settings) as st:
        st.register_policy_version("v0", model_name="m", global_step=0)
        st.start_rollout("ra", policy_version_id="v0")
        for cid in ("a0", "a1"):
            _, turn, p, c = CALLS[cid]
            st.record_call(make_call(cid, "ra", turn, prompt_ids=p, completion_ids=c))
        st.finish_rollout("ra", "success")
        yield st


def test_served_rescore_stores_the_prompt_logprobs_of_the_stored_ids_once(store):
    with PromptLogprobServer() as engine:
        res = rescore(store, "v0", scorer="vllm-served", engines=[engine.url + "/v1"], concurrency=2)
        assert res.written == res.scored_calls == 4 and res.already == 0
        assert res.tokens == sum(len(c) for *_, c in CALLS.values())
        # one request per rollout chain: a1 carries a0; b1 does not extend b0
        sent = sorted(map(tuple, (r["prompt"] for r in engine.requests)))
        assert sent == sorted([tuple(P1 + C1), (3, 4, 5, 6, 7), (3, 4, 99, 8)])
        assert all(r["max_tokens"] == 1 and r["prompt_logprobs"] == 0 and r["model"] == "m" for r in engine.requests)
        rows = {r.call_id: r for r in rescores(store, policy_version_id="v0", scorer="vllm-served")}
        for cid, (rid, _, p, c) in CALLS.items():
            assert rows[cid].logprobs == pytest.approx(expected(p, c), abs=1e-6)
            assert rows[cid].rollout_id == rid
        lineage = rows["a0"].scorer_lineage
        assert lineage == {"scorer": "vllm-served", "engine": "vllm", "engine_urls": [engine.url],
                           "served_model": "m", "model_root": "/models/m", "max_model_len": 4096,
                           "engine_version": "0.32.0", "dtype": "float32", "checkpoint_hash": "abc"}

        again = rescore(store, "v0", scorer="vllm-served", engines=[engine.url])
        assert (again.written, again.scored_calls, again.already) == (0, 0, 4)
        assert len(engine.requests) == 3   # nothing asked again
    assert len(rescores(store)) == 4


def test_a_run_stopped_by_a_failing_engine_keeps_what_it_scored_and_resumes(sqlite_store, tmp_path):
    st = sqlite_store
    st.start_rollout("rc", policy_version_id="v0")
    for k in range(5):   # five independent rollouts' worth of requests
        st.record_call(make_call(f"c{k}", "rc", k, prompt_ids=[50 + k, 51 + k], completion_ids=[60 + k, 2]))
    st.finish_rollout("rc", "success")
    with PromptLogprobServer(fail_after=2) as engine:
        with pytest.raises(RescoreError, match=r"500 EngineCore encountered an issue.*re-scores were stored; a run "
                                               r"again resumes after them"):
            rescore(st, "v0", scorer="vllm-served", engines=[engine.url], concurrency=1, batch=1)
    stored = {r.call_id for r in rescores(st)}
    assert 1 <= len(stored) < 7
    with PromptLogprobServer() as engine:
        res = rescore(st, "v0", scorer="vllm-served", engines=[engine.url])
    assert res.already == len(stored) and res.written == 7 - len(stored)
    assert len({r.call_id for r in rescores(st)}) == 7


def test_without_dev_mode_the_dtype_is_unknown(sqlite_store):
    with PromptLogprobServer(dev_mode=False) as engine:
        res = rescore(sqlite_store, "v0", scorer="vllm-served", engines=[engine.url])
    assert res.lineage["dtype"] is None and res.written == 2


@pytest.mark.parametrize("kw, args, match", [
    ({}, {"engines": ["http://127.0.0.1:9"]}, r"--engine http://127.0.0.1:9/v1/models: cannot be asked \(Connect"
                                              r"Error.*start the server of the version"),
    ({"model": "other"}, {}, r"does not serve 'm' \(policy version 'v0''s model\); it serves 'other': point "
                             r"--engine at a server of the version, or pass --served-model NAME"),
    ({"model": "other"}, {"served_model": "nope"}, r"does not serve 'nope'"),
    ({"short": True}, {}, r"answered call a1 with 10 prompt logprobs for its 11 token ids: a vLLM server gives one "
                          r"per prompt token"),
    ({"max_model_len": 11}, {}, r"call a1 is 11 tokens \(prompt \+ completion\) and scoring it takes 12 \(max_tokens "
                                r"1\), above the max_model_len 11 that http://127.0.0.1:\d+ serves; start the server of "
                                r"the version with --max-model-len 12 or more"),
    ({}, {"engines": [], "proxy": None}, "pass --engine URL \\(repeatable\\) or --proxy URL"),
    ({}, {"concurrency": 0}, "--concurrency 0: send at least 1"),
    ({}, {"scorer": "hf-float32"}, "--engine / --proxy are for --scorer vllm-served"),
])
def test_served_errors_name_the_value_and_the_fix(sqlite_store, kw, args, match):
    with PromptLogprobServer(**kw) as engine:
        args = {"scorer": "vllm-served", "engines": [engine.url], **args}
        with pytest.raises(RescoreError, match=match):
            rescore(sqlite_store, "v0", **args)
    assert rescores(sqlite_store) == []


def test_through_the_proxy_its_replicas_score_its_active_version_only(sqlite_store, tmp_path):
    from tests.proxy_fixtures import Up, make_proxy

    url = str(sqlite_store.engine.url)
    with PromptLogprobServer() as a, PromptLogprobServer() as b:
        px, serve = make_proxy(Up(double=None, url=a.url, server=None), tmp_path, store_url=url)
        try:
            assert px.admin("POST", "/admin/upstreams", json={"url": b.url}).status_code == 200
            r = px.admin("POST", "/admin/policy_versions", json={"id": "v0", "model_name": "m", "activate": True})
            assert r.status_code == 200, r.text
            r = px.admin("POST", "/admin/policy_versions", json={"id": "v1", "model_name": "m", "activate": False})
            assert r.status_code == 200, r.text
            assert px.store.flush(30)
            with pytest.raises(RescoreError, match=r"serves policy version 'v0', not 'v1': its engine replicas hold "
                                                   r"the active version's weights only"):
                rescore(sqlite_store, "v1", scorer="vllm-served", proxy=px.url, admin_token=px.proxy.admin_token)
            with pytest.raises(RescoreError, match="the admin API refused the token"):
                rescore(sqlite_store, "v0", scorer="vllm-served", proxy=px.url, admin_token="wrong")
            res = rescore(sqlite_store, "v0", scorer="vllm-served", proxy=px.url, admin_token=px.proxy.admin_token)
            assert res.written == 2 and res.lineage["proxy"] == px.url
            assert sorted(res.lineage["engine_urls"]) == sorted([a.url, b.url])
            assert a.requests and not b.requests or b.requests and not a.requests   # one chain: one request
            assert rescores(sqlite_store, policy_version_id="v1") == []
        finally:
            serve.stop()
            px.store.close()


def test_a_weight_switch_during_the_rescore_refuses_the_batch_it_could_touch(sqlite_store, tmp_path):
    from tests.proxy_fixtures import Up, make_proxy

    switch = {}
    with PromptLogprobServer(before_answer=lambda _: switch["to"]()) as engine:
        px, serve = make_proxy(Up(double=None, url=engine.url, server=None), tmp_path,
                               store_url=str(sqlite_store.engine.url))
        try:
            r = px.admin("POST", "/admin/policy_versions", json={"id": "v0", "model_name": "m", "activate": True})
            assert r.status_code == 200, r.text
            switch["to"] = lambda: px.admin("POST", "/admin/policy_versions", json={"id": "v1", "model_name": "m"})
            with pytest.raises(RescoreError, match=r"serves policy version 'v1', not 'v0'.* \(0 re-scores were stored"):
                rescore(sqlite_store, "v0", scorer="vllm-served", proxy=px.url, admin_token=px.proxy.admin_token,
                        batch=1)
        finally:
            serve.stop()
            px.store.close()
    assert rescores(sqlite_store) == []


def test_rescore_command_with_engine(sqlite_store, tmp_path):
    from typer.testing import CliRunner

    from openforge.cli import build_app

    url = str(sqlite_store.engine.url)
    with PromptLogprobServer() as engine:
        r = CliRunner().invoke(build_app(), ["rescore", "--version", "v0", "--scorer", "vllm-served", "--engine",
                                             engine.url, "--json", "--store", url])
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["written"] == 2 and out["lineage"]["engine"] == "vllm"
        bad = CliRunner().invoke(build_app(), ["rescore", "--version", "v0", "--scorer", "vllm-served", "--store",
                                               url])
        assert bad.exit_code == 2 and "pass --engine URL" in " ".join(bad.output.split())
