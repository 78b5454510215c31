"""Rewards nobody can forge: a task whose naive verifier (``cd "$OPENFORGE_WORKSPACE"; exec python3 -``, no ``-I``)
is run against solutions that, through the ``oracle`` harness, plant things for the verifier instead of doing the
task. The platform, not the verifier, has to defend: through the real orchestrator and store, every such rollout is
recorded with the honest reward (0, the task was not done) and an honest solution still gets 1.0.
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap

import pytest

from forge_store import RolloutFilter
from rollout._task import load_task
from tests.rollout_fixtures import write_task

# A naive verifier, on purpose: Python from the workspace, whatever HOME and PATH it is given.
NAIVE_TEST = """#!/bin/bash
cd "$OPENFORGE_WORKSPACE"
exec python3 - <<'EOF'
import json, os
expected = open(os.path.join(os.environ["OPENFORGE_TESTS"], "expected.txt")).read().strip()
try:
    ok = open("answer.txt").read().strip() == expected
except OSError:
    ok = False
with open(os.path.join(os.environ["OPENFORGE_REWARD_DIR"], "reward.json"), "w") as f:
    json.dump({"reward": 1.0 if ok else 0.0}, f)
EOF
"""

FORGE_PY = ("import atexit, json, os; atexit.register(lambda: open(os.environ.get('OPENFORGE_REWARD_DIR', "
            "'/logs/verifier') + '/reward.json', 'w').write(json.dumps(dict(reward=1.0))))")
SITE = '$HOME/.local/lib/$(python3 -c "import sys; print(\'python%d.%d\' % sys.version_info[:2])")/site-packages'
# no single quote in it: it goes inside bash -c '...'
WRITE_REWARD = ('for d in /logs/verifier "$OPENFORGE_REWARD_DIR"; do echo "{\\"reward\\": 1.0}" > $d/reward.json; '
                'echo 1 > $d/reward.txt; done 2>/dev/null')
# waits until the harness phase is over (the answer it writes would otherwise be the harness's own), then keeps at it
LATE = f"sleep 1; for i in $(seq 300); do echo ok > /workspace/answer.txt; {WRITE_REWARD}; sleep 0.02; done"

TRICKS = {
    # a module named like the stdlib one the verifier imports, first on sys.path when python3 runs from the cwd
    "shadow-json": """cat > json.py <<'EOF'
def dump(obj, f, **kw):
    f.write('{"reward": 1.0}')
def dumps(obj, **kw):
    return '{"reward": 1.0}'
EOF
cp json.py "$HOME/json.py" """,
    "user-site-pth": f'mkdir -p {SITE} && echo "{FORGE_PY}" > {SITE}/forge.pth',
    "sitecustomize": f'mkdir -p {SITE} && echo "{FORGE_PY}" > {SITE}/sitecustomize.py',
    "usercustomize": f'mkdir -p {SITE} && echo "{FORGE_PY}" > {SITE}/usercustomize.py',
    "python3-shim": f"""mkdir -p ~/bin /tmp/bin
printf '#!/bin/sh\\n%s\\n' '{WRITE_REWARD}' > ~/bin/python3
cp ~/bin/python3 /tmp/bin/python3; chmod +x ~/bin/python3 /tmp/bin/python3
for rc in .bashrc .profile .bash_profile .bash_login .bash_logout; do
  echo 'export PATH=$HOME/bin:/tmp/bin:$PATH BASH_ENV=$HOME/.bashrc ENV=$HOME/.bashrc' >> ~/$rc; done
cp ~/.bashrc ~/.env""",
    "reward-in-advance": f"mkdir -p /logs/verifier \"$OPENFORGE_REWARD_DIR\" 2>/dev/null; {WRITE_REWARD}; true",
    "late-writer": f"""setsid nohup bash -c '{LATE}' >/dev/null 2>&1 &
( ( bash -c '{LATE}' >/dev/null 2>&1 & ) & )
true""",
    "links-out": """ln -sf /tests/expected.txt answer.txt
ln -s /tests tests; ln -s /logs/verifier rewards; ln -s /tests/expected.txt "$HOME/answer.txt"
ln -s /tests/expected.txt /tmp/e; mkdir -p sub; ln -s /tmp/e sub/answer.txt""",
    "link-via-tmp": "ln -s /tests/expected.txt /tmp/e; ln -sf /tmp/e answer.txt",
    "ld-preload": """cp /solution/forge.so ~/forge.so 2>/dev/null; cp ~/forge.so /tmp/forge.so 2>/dev/null
cp ~/forge.so /workspace/forge.so 2>/dev/null
for rc in .bashrc .profile .bash_profile; do echo 'export LD_PRELOAD=$HOME/forge.so' >> ~/$rc; done
echo /tmp/forge.so > /etc/ld.so.preload 2>/dev/null
export LD_PRELOAD=$HOME/forge.so; true""",
    # many detached writers, and processes that keep moving to a new pid, so one pass over /proc misses some
    "swarm": f"""for i in $(seq 30); do setsid bash -c '{LATE}' >/dev/null 2>&1 & done
for i in $(seq 10); do setsid bash -c 'h() {{ ( {WRITE_REWARD}; sleep 0.01; h ) & }}; h' \
  >/dev/null 2>&1 & done
true""",
}

FORGE_SO = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((destructor)) static void forge(void) {
    const char *d = getenv("OPENFORGE_REWARD_DIR");
    char p[512];
    snprintf(p, sizeof p, "%s/reward.json", d ? d : "/logs/verifier");
    FILE *f = fopen(p, "w");
    if (f) { fputs("{\"reward\": 1.0}", f); fclose(f); }
}
"""


def forging_task(root, name: str, solve_sh: str):
    d = write_task(root, name, test_sh=NAIVE_TEST, instruction="Write the word ok to /workspace/answer.txt.",
                   solve_sh=solve_sh)
    (d / "tests" / "expected.txt").write_text("ok\n")
    (d / "tests" / "expected.txt").chmod(0o644)
    if "forge.so" in solve_sh and shutil.which("cc"):
        src = root / f"{name}.c"
        src.write_text(FORGE_SO)
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(d / "solution" / "forge.so"), str(src)], check=True)
        (d / "solution" / "forge.so").chmod(0o644)
    return load_task(d)


def _recorded(forge, rollout_id):
    (ro,) = [r for r in forge.store.iter_rollouts(RolloutFilter()) if r.id == rollout_id]
    return ro.outcome, [r.value for r in forge.store.rewards(ro.id)]


@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_a_planted_reward_is_never_recorded(forge, shared_tmp, trick):
    solve = "echo nope > /workspace/answer.txt\n" + textwrap.dedent(TRICKS[trick]) + "\nexit 0\n"
    task = forging_task(shared_tmp / "tasks", f"forge-{trick}", solve)
    summary = forge.run([task], "oracle", max_infra_retries=0)
    (res,) = summary.results
    assert (res.outcome, res.reward) == ("failure", 0.0), (res.outcome, res.reward, res.detail[-1500:])
    assert _recorded(forge, res.rollout_id) == ("failure", [0.0])
    assert forge.store.lineage("exclusions") == []
    assert forge.sandboxes() == []


def test_the_honest_solution_scores_1(forge, shared_tmp):
    task = forging_task(shared_tmp / "tasks", "honest", "echo ok > /workspace/answer.txt\n")
    summary = forge.run([task], "oracle", max_infra_retries=0)
    (res,) = summary.results
    assert (res.outcome, res.reward) == ("success", 1.0), res.detail[-1500:]
    assert _recorded(forge, res.rollout_id) == ("success", [1.0])


def test_an_honest_answer_next_to_a_planted_module_still_scores_1(forge, shared_tmp):
    """The defences take nothing honest away: a json.py in the workspace does not break the verifier's import."""
    solve = "echo ok > /workspace/answer.txt\n" + textwrap.dedent(TRICKS["shadow-json"]) + "\n"
    task = forging_task(shared_tmp / "tasks", "honest-with-json", solve)
    (res,) = forge.run([task], "oracle", max_infra_retries=0).results
    assert (res.outcome, res.reward) == ("success", 1.0), res.detail[-1500:]
