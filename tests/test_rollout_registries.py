"""The rollout part's registries (sandbox backends, harness adapters): an unknown name fails with the list of known
ones, and a backend whose optional extra is missing says which extra to install."""

from __future__ import annotations

import sys

import pytest

from rollout import SandboxError, backend_names, get_backend, get_harness, harness_names


@pytest.mark.parametrize("get, names", [(get_backend, backend_names), (get_harness, harness_names)])
def test_an_unknown_name_fails_with_the_known_ones(get, names):
    with pytest.raises(KeyError) as err:
        get("nope")
    message = str(err.value)
    assert "'nope' is unknown" in message and ", ".join(names()) in message


def test_kubernetes_without_its_extra_says_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "kubernetes", None)    # `import kubernetes` fails as if it were not installed
    with pytest.raises(SandboxError, match=r"install the k8s extra: pip install 'openforge\[k8s\]'") as err:
        get_backend("kubernetes")
    assert err.value.kind == "sandbox_missing"
