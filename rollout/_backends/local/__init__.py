"""The local sandbox backend, on bubblewrap: one set of namespaces per rollout, no cluster, no container engine.

Each sandbox gets a private workspace and HOME (host folders under ``root/<rollout id>/``), a read-only view of
``/usr`` and a short list of ``/etc`` files, private ``/tmp``, ``/proc`` and ``/dev``, its own pid, ipc, uts and
network namespaces (only loopback), and the proxy through one bind-mounted Unix socket that ``sandbox_init`` relays
to ``127.0.0.1:8000`` inside. When the orchestrator runs as root, bubblewrap is started as an unprivileged user
(``nobody``) so nothing root-owned on the host is readable even if a path were mounted by mistake; inside, the
harness is uid 1000 with no capabilities.

Phases run inside the same namespaces through ``sandbox_init`` (an inherited socket, not a path). Per-phase mounts
(``/tests`` for the verifier, ``/solution`` for the oracle, ``/logs/verifier``) are bind-mounted from empty,
root-owned staging folders at creation and filled only while their phase runs, so the harness never sees them.
``sandbox_init`` is the namespace's pid 1, out of the harness's reach; the verifier (a ``clean`` phase) runs only
once every harness process is dead, with ``base.verifier_env``, a fresh HOME, and the workspace sealed by the host
(``Staging.seal``); its reward is read from the host's side of the bind, never through a link
(``docs/rollouts.md``, "What a verifier may rely on").

Not enforced here (say so rather than pretend): CPU and memory limits (no cgroup delegation without systemd); the
file-size limit applies per process (RLIMIT_FSIZE).

Modules: ``backend`` (``LocalBackend``, the ``SandboxBackend`` protocol), ``bwrap`` (the sandbox's layout and the
command line that builds it), ``staging`` (host folders and files made visible to the sandbox user), ``control``
(the socket to ``sandbox_init``), ``processes`` (starting, killing and reaping bubblewrap), ``sandbox_init`` (the
script that runs inside, by path).
"""

from .backend import LocalBackend

__all__ = ["LocalBackend"]
