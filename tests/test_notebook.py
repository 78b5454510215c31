"""examples/analysis.ipynb runs top to bottom (nbclient, a real kernel) against a seeded store."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

from forge_store import Settings, open_store
from forge_store.testing import seed_demo_store

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "analysis.ipynb"


def test_analysis_notebook_runs(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with open_store(url, settings=Settings(home=tmp_path / "home")) as st:
        seed_demo_store(st, n_tasks=3, per_task=4)
    monkeypatch.setenv("OPENFORGE_STORE_URL", url)  # the kernel inherits the environment
    monkeypatch.setenv("OPENFORGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = "\n".join(o.get("data", {}).get("text/plain", "") for o in outputs)
    for expected in ("policy-v1", "policy-v2", "shell", "pass@2", "self_verification_rate", "infra_error"):
        assert expected in html, expected
