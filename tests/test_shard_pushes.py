"""bench/shard_pushes.py: the first-token push each loss aggregation gives a round's openings (stop or tool call),
on a veRL-shaped parquet shard written here. A group whose successes are short and whose failures are long pushes
stopping under ``seq-mean-token-mean`` (each token weighs advantage / length) and not at all under
``seq-mean-token-sum-norm`` (advantage / one horizon: the group's advantages sum to 0, one stop a rollout)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

_spec = importlib.util.spec_from_file_location("shard_pushes", Path(__file__).parents[1] / "bench" / "shard_pushes.py")
pushes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pushes)

TOOL, TEXT, END, OBS = 1, 2, 3, 9   # token ids of the toy vocabulary below


class ToyTokenizer:
    """Decodes the four ids the shard uses: a tool call's opening, text, the end of an answer, a tool's output."""

    words = {TOOL: "<tool_call>", TEXT: "done", END: "<|im_end|>", OBS: "output"}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.words[i] for i in ids)


def _rollout(rid: str, calls: int, answer_len: int, reward: float, adv: float) -> dict:
    ids, mask = [], []
    for _ in range(calls):   # a tool call answer, then the tool's output (not the policy's)
        ids += [TOOL] + [TEXT] * (answer_len - 2) + [END] + [OBS] * 3
        mask += [1] * answer_len + [0] * 3
    ids += [TEXT] * (answer_len - 1) + [END]   # the answer that ends the turn
    mask += [1] * answer_len
    return {"rollout_id": rid, "key": f"{rid}_s_0", "response_ids": ids, "response_mask": mask,
            "advantage": adv, "reward_score": reward}


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    # one group: two short successes (1 call), two long failures (4 calls); advantages sum to 0
    rows = [_rollout("a", 1, 5, 1.0, 1.0), _rollout("b", 1, 5, 1.0, 1.0),
            _rollout("c", 4, 5, 0.0, -1.0), _rollout("d", 4, 5, 0.0, -1.0)]
    d = tmp_path / "grpo-r1"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), d / "trajectories-00000.parquet")
    return d


def test_seq_mean_token_mean_pushes_stopping_when_successes_are_short(shard):
    res = pushes.shard_pushes(shard, ToyTokenizer(), "seq-mean-token-mean")
    # stop: 2 x (1 / 10 tokens) - 2 x (1 / 25 tokens); tool: 2 x 1/10 - 2 x 4/25
    assert res["net_text"] == pytest.approx(2 / 10 - 2 / 25, abs=1e-6)
    assert res["net_tool"] == pytest.approx(2 / 10 - 8 / 25, abs=1e-6)
    assert res["net_text_share"] > 0 and res["rollouts"] == 4


def test_dr_grpo_leaves_stopping_alone_and_pushes_calls_by_their_covariance_with_reward(shard):
    res = pushes.shard_pushes(shard, ToyTokenizer(), "seq-mean-token-sum-norm")
    horizon = 4 * 8 + 5   # the longest response: 4 calls of 5 + 3 output tokens, then the last answer
    assert res["net_text"] == pytest.approx(0.0)
    assert res["net_tool"] == pytest.approx((2 * 1 - 2 * 4) / horizon, abs=1e-6)
    assert res["net_tool_share"] < 0


def test_unknown_aggregation_is_refused(shard):
    with pytest.raises(ValueError, match="'token-mean'.*seq-mean-token-mean"):
        pushes.shard_pushes(shard, ToyTokenizer(), "token-mean")
