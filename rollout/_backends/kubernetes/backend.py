"""``KubernetesBackend``: one pod per rollout behind the ``SandboxBackend`` protocol.

Hot path per rollout: create Secret (+ ConfigMaps) + Pod; wait on the shared pod watch for each phase's container;
read results from termination messages; list the pod's Events once; delete. ``exec`` / ``put_file`` / ``get_file``
use the API server's exec stream and exist for debugging only.
"""

from __future__ import annotations

import threading
import time
import uuid

from ..base import Phase, PhaseResult, Sandbox, SandboxError, SandboxSpec
from . import classify, manifests
from .api import Api, ApiError, make_api_client, require_client
from .config import KubernetesConfig
from .results import ResultError, parse_message, split_log
from .watcher import PodWatcher, matches, selector_string

VERSION = "1"


class KubernetesBackend:
    name = "kubernetes"

    def __init__(self, config: KubernetesConfig | None = None, *, api_client=None, host: str | None = None):
        require_client()
        self.cfg = config or KubernetesConfig()
        self.api = Api(self.cfg, api_client if api_client is not None else make_api_client(self.cfg, host))
        self.watcher = PodWatcher(self.api, self.cfg.namespace, dict(manifests.MANAGED))
        self.instance = uuid.uuid4().hex[:12]
        self._slots = threading.BoundedSemaphore(self.cfg.max_pods_in_flight)
        self._policy_done = False
        self._digests: dict[str, str] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self.watcher.close()

    # --- creation
    def proxy_url(self) -> str:
        return self.cfg.proxy_url

    def create(self, spec: SandboxSpec) -> Sandbox:
        t0 = time.monotonic()
        image_ref = spec.image or self.cfg.default_image
        image = manifests.pinned_image(image_ref, self.cfg, self._digests)
        pod, secret, configmaps, plan = manifests.build(spec, self.cfg, image)
        self._ensure_network_policy()
        self._slots.acquire()
        sandbox = Sandbox(id=plan.pod, spec=spec, backend=self.name, created_at=time.time(), backend_state={
            "pod": plan.pod, "secret": plan.secret, "configmaps": list(plan.configmaps),
            "containers": plan.containers, "image_ref": image_ref, "image": image, "first_seen": {},
            "killed": None, "slot": True, "owned": []})
        owned, core = sandbox.backend_state["owned"], self.api.core
        try:
            self._create("secrets", core.create_namespaced_secret, core.read_namespaced_secret, secret, spec)
            owned.append(("secrets", plan.secret))
            for cm in configmaps:
                self._create("configmaps", core.create_namespaced_config_map, core.read_namespaced_config_map, cm,
                             spec)
                owned.append(("configmaps", cm["metadata"]["name"]))
            created = self._create("pods", core.create_namespaced_pod, core.read_namespaced_pod, pod, spec)
            owned.insert(0, ("pods", plan.pod))
            self.watcher.track(plan.pod, created)
        except BaseException:
            self.destroy(sandbox)
            raise
        sandbox.started_ms = (time.monotonic() - t0) * 1000
        return sandbox

    def _create(self, resource: str, create, read, body: dict, spec: SandboxSpec) -> dict:
        """Create; a 409 is fine when the object there is this rollout's (a retried POST that had landed)."""
        name = body["metadata"]["name"]
        try:
            return self.api.call("create", resource, create, self.cfg.namespace, body)
        except ApiError as exc:
            if exc.status != 409:
                raise
        existing = self.api.call("get", resource, read, name, self.cfg.namespace)
        owner = ((existing.get("metadata") or {}).get("annotations") or {}).get(manifests.LABEL_PREFIX + "rollout-id")
        if owner != spec.rollout_id:
            raise ApiError(f"create {resource}/{name}: the name is taken by rollout {owner!r}, not "
                           f"{spec.rollout_id!r}; reap leftovers (`reap`) or use a fresh rollout id", status=409)
        return existing

    def _ensure_network_policy(self) -> None:
        with self._lock:
            if self._policy_done:
                return
            try:
                self.api.call("create", "networkpolicies", self.api.net.create_namespaced_network_policy,
                              self.cfg.namespace, manifests.network_policy(self.cfg))
            except ApiError as exc:
                if exc.status != 409:
                    raise
            self._policy_done = True

    # --- phases
    def run_phase(self, sandbox: Sandbox, phase: Phase, *, cancel: threading.Event | None = None) -> PhaseResult:
        st = sandbox.backend_state
        if phase.name not in st["containers"]:
            raise SandboxError(f"phase {phase.name!r} was not declared in the spec at create(); a pod's phases are "
                               f"fixed up front (declared: {sorted(st['containers'])})", kind="spec_invalid")
        cname, kind = st["containers"][phase.name]
        t0 = time.monotonic()
        while True:
            pod, deleted = self.watcher.state(st["pod"])
            now = time.time()
            if pod is not None:
                cs = classify.container(pod, cname)
                state = cs.get("state") or {}
                if (pod.get("status") or {}).get("reason") not in ("Evicted", "DeadlineExceeded") \
                        and "terminated" in state and kind != "sidecar":
                    return self._result(sandbox, phase, cname, state["terminated"])
                if deleted:
                    break
                classify.check_pod(pod, own=cname, seed=manifests.SEED, first_seen=st["first_seen"], now=now,
                                   image_pull_grace_s=self.cfg.image_pull_grace_s,
                                   unschedulable_grace_s=self.cfg.unschedulable_grace_s)
                if kind == "sidecar" and cs.get("started"):
                    return PhaseResult(phase.name, exit_code=0, duration_s=time.monotonic() - t0)
                started = classify.parse_time((state.get("running") or {}).get("startedAt"))
                if kind == "sidecar" and started is None and cs:
                    started = st["first_seen"].setdefault(f"sidecar:{cname}", now)
                if started is not None and now > started + phase.timeout_s + self.cfg.deadline_grace_s:
                    self._kill(sandbox, "timeout")
                    return PhaseResult(phase.name, exit_code=None, timed_out=True,
                                       duration_s=time.monotonic() - t0)
            elif deleted:
                break
            if cancel is not None and cancel.is_set():
                self._kill(sandbox, "cancelled")
                return PhaseResult(phase.name, exit_code=None, cancelled=True, duration_s=time.monotonic() - t0)
            self.watcher.wait(0.5)
        killed = st.get("killed")
        raise SandboxError(f"pod {st['pod']} was deleted while phase {phase.name!r} waited"
                           + (f" (by this backend: {killed})" if killed else " (not by this backend)"),
                           kind="sandbox_lost")

    def _result(self, sandbox: Sandbox, phase: Phase, cname: str, term: dict) -> PhaseResult:
        started = classify.parse_time(term.get("startedAt"))
        finished = classify.parse_time(term.get("finishedAt"))
        duration = (finished - started) if started and finished else 0.0
        stdout = b""
        note = ""
        try:
            wrapped = parse_message(term.get("message") or "")
        except ResultError as exc:
            wrapped, note = None, str(exc)
        if self.cfg.phase_log_bytes:
            text = self._log(sandbox, cname, self.cfg.phase_log_bytes)
            try:
                stdout = split_log(text)[0].encode()
            except ResultError:          # the head of the log holds a start marker and no end: print it as it is
                stdout = text.encode()
        if wrapped and wrapped.overflow:
            # Only the log's last line: the wrapper prints the result there after ARGV (in the verifier, after every
            # process ARGV started) ended, so nothing ARGV printed, however long, can stand in for it.
            try:
                _, overflowed = split_log(self._log(sandbox, cname, tail_lines=1))
            except ResultError as exc:
                raise SandboxError(f"container {cname}: {exc}", kind="sandbox_lost") from None
            if overflowed is None:
                raise SandboxError(f"container {cname}: the result overflowed the termination message but the last "
                                   f"line of its log holds no copy (the container was killed while printing it)",
                                   kind="sandbox_lost")
            wrapped = overflowed
        if term.get("reason") == "OOMKilled":
            note = f"container {cname} was OOM-killed (memory limit {sandbox.spec.resources.memory_mb} MiB). " + note
        if wrapped is None:
            exit_code = term.get("exitCode")
            return PhaseResult(phase.name, exit_code=exit_code, duration_s=duration, stdout=stdout,
                               stderr=note.encode())
        return PhaseResult(phase.name, exit_code=None if wrapped.timed_out else wrapped.exit_code,
                           timed_out=wrapped.timed_out, duration_s=duration, stdout=stdout, stderr=note.encode(),
                           outputs={p: b for p, b in wrapped.outputs.items() if p in phase.outputs})

    def _kill(self, sandbox: Sandbox, why: str) -> None:
        sandbox.backend_state["killed"] = why
        self._delete("pods", self.api.core.delete_namespaced_pod, sandbox.backend_state["pod"])

    # --- reading
    def _log(self, sandbox: Sandbox, container: str, limit: int | None = None, tail_lines: int | None = None) -> str:
        kwargs = {"limit_bytes": limit} if limit else {}
        if tail_lines:
            kwargs["tail_lines"] = tail_lines
        try:
            return self.api.call("get", "pods/log", self.api.core.read_namespaced_pod_log, sandbox.backend_state["pod"],
                                 self.cfg.namespace, container=container, raw=True, **kwargs)
        except ApiError as exc:
            if exc.status in (400, 404):
                return ""
            raise

    def logs(self, sandbox: Sandbox) -> str:
        """The seed and service (sidecar) containers' logs; phase output comes back with each phase."""
        names = [manifests.SEED] + [c for c, k in sandbox.backend_state["containers"].values() if k == "sidecar"]
        return "".join(f"== {c} ==\n{self._log(sandbox, c)}\n" for c in names)

    def events(self, sandbox: Sandbox) -> list[dict]:
        pod = sandbox.backend_state["pod"]
        listing = self.api.call("list", "events", self.api.core.list_namespaced_event, self.cfg.namespace,
                                field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod}")
        out = []
        for ev in listing.get("items", []):
            inv = ev.get("involvedObject") or {}
            if inv.get("name") != pod or inv.get("kind", "Pod") != "Pod":
                continue
            out.append({"time": ev.get("lastTimestamp") or ev.get("eventTime") or ev.get("firstTimestamp"),
                        "type": ev.get("type"), "reason": ev.get("reason"), "message": ev.get("message"),
                        "count": ev.get("count", 1), "source": "kubernetes",
                        "component": (ev.get("source") or {}).get("component") or ev.get("reportingComponent"),
                        "object": f"pod/{pod}"})
        return sorted(out, key=lambda e: e["time"] or "")

    def describe(self, sandbox: Sandbox) -> dict:
        st = sandbox.backend_state
        pod, _ = self.watcher.state(st["pod"])
        pod = pod or {}
        main = next(c for c, k in st["containers"].values() if k == "main")
        image_id = classify.container(pod, main).get("imageID") or ""
        digest = image_id.rsplit("@", 1)[1] if "@" in image_id else None
        if digest and "@" not in st["image_ref"]:
            with self._lock:
                self._digests.setdefault(st["image_ref"], digest)
        return {"backend": self.name, "backend_version": VERSION, "namespace": self.cfg.namespace,
                "pod_name": st["pod"], "node_name": (pod.get("spec") or {}).get("nodeName"),
                "image_ref": st["image_ref"], "image": st["image"], "image_digest": digest,
                "image_ids": {n: cs.get("imageID") for n, cs in classify.statuses(pod).items()},
                "pod_phase": (pod.get("status") or {}).get("phase"), "killed": st.get("killed")}

    # --- removal
    def _delete(self, resource: str, fn, name: str) -> bool:
        try:
            self.api.call("delete", resource, fn, name, self.cfg.namespace, grace_period_seconds=0,
                          propagation_policy="Background")
            return True
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise

    def destroy(self, sandbox: Sandbox) -> None:
        """Delete what this backend created for the sandbox (never an object a 409 showed to be someone else's;
        a POST that landed but never answered is left to ``reap``)."""
        st = sandbox.backend_state
        core = self.api.core
        deleters = {"pods": core.delete_namespaced_pod, "secrets": core.delete_namespaced_secret,
                    "configmaps": core.delete_namespaced_config_map}
        try:
            for resource, name in st["owned"]:
                self._delete(resource, deleters[resource], name)
        finally:
            self.watcher.forget(st["pod"])
            if st.pop("slot", False):
                self._slots.release()

    def reap(self, *, run_id: str | None = None) -> list[str]:
        selector = dict(manifests.MANAGED)
        if run_id is not None:
            selector[manifests.LABEL_PREFIX + "run"] = manifests.label_value(run_id)
        core, removed = self.api.core, []
        for resource, lister, deleter in (
                ("pods", core.list_namespaced_pod, core.delete_namespaced_pod),
                ("secrets", core.list_namespaced_secret, core.delete_namespaced_secret),
                ("configmaps", core.list_namespaced_config_map, core.delete_namespaced_config_map)):
            listing = self.api.call("list", resource, lister, self.cfg.namespace,
                                    label_selector=selector_string(selector))
            for item in listing.get("items", []):
                name = (item.get("metadata") or {}).get("name")
                if name and matches(item, selector) and self._delete(resource, deleter, name):
                    removed.append(f"{resource}/{name}")
        return removed

    # --- debugging only: the API server's exec stream (not on the hot path; the emulator cannot exec)
    def exec(self, sandbox: Sandbox, argv: list[str], *, timeout_s: float = 60.0,
             env: dict[str, str] | None = None, stdin: bytes | None = None) -> PhaseResult:
        from kubernetes.stream import stream

        if env:
            argv = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]
        main = next(c for c, k in sandbox.backend_state["containers"].values() if k == "main")
        self.api.bucket.take()
        self.api.count("create pods/exec")
        t0 = time.monotonic()
        resp = stream(self.api.core.connect_get_namespaced_pod_exec, sandbox.backend_state["pod"],
                      self.cfg.namespace, container=main, command=argv, stdin=stdin is not None, stdout=True,
                      stderr=True, tty=False, _preload_content=False)
        out, err = [], []
        if stdin is not None:
            resp.write_stdin(stdin.decode("latin-1"))
        while resp.is_open() and time.monotonic() - t0 < timeout_s:
            resp.update(timeout=1)
            out.append(resp.read_stdout() if resp.peek_stdout() else "")
            err.append(resp.read_stderr() if resp.peek_stderr() else "")
        timed_out = resp.is_open()
        resp.close()
        return PhaseResult("exec", exit_code=None if timed_out else resp.returncode, timed_out=timed_out,
                           duration_s=time.monotonic() - t0, stdout="".join(out).encode(),
                           stderr="".join(err).encode())

    def put_file(self, sandbox: Sandbox, path: str, data: bytes, mode: int = 0o644) -> None:
        import base64
        r = self.exec(sandbox, ["/bin/sh", "-c", f'base64 -d > "$0" && chmod {mode:o} "$0"', path],
                      stdin=base64.b64encode(data))
        if r.exit_code != 0:
            raise SandboxError(f"put_file {path}: exit {r.exit_code}: {r.stderr.decode()[:300]}", kind="exec")

    def get_file(self, sandbox: Sandbox, path: str) -> bytes:
        import base64
        r = self.exec(sandbox, ["/bin/sh", "-c", 'base64 < "$0"', path])
        if r.exit_code != 0:
            raise SandboxError(f"get_file {path}: exit {r.exit_code}: {r.stderr.decode()[:300]}", kind="exec")
        return base64.b64decode(r.stdout)
