"""A Kubernetes API server emulator on loopback, for tests and the API-load bench (needs ``kmock``).

``Emulator`` runs kmock's ``KubernetesEmulator`` (an in-memory object store that speaks the API over real HTTP,
with list / watch / create / patch / delete) in a thread, adds fault injection (``inject``: answer the next N
matching requests with a status and headers before the emulator sees them) and pod logs, and counts requests by
verb. ``FakeKubelet`` writes pod status and Events through the official client exactly as the scheduler and
kubelet would. What the emulator does not do (and the docs say so): label/field selectors (the backend filters
client-side too), resourceVersions, exec, admission, and anything a kubelet does on its own.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import json
import re
import threading
import uuid
from dataclasses import dataclass, field

import aiohttp.web
import attrs
import kmock

from rollout._backends.kubernetes.results import message

RESOURCES = ("v1/pods", "v1/secrets", "v1/configmaps", "v1/events", "networking.k8s.io/v1/networkpolicies")
_VERBS = {"LIST": "list", "WATCH": "watch", "FETCH": "get", "CREATE": "create", "UPDATE": "patch",
          "DELETE": "delete"}


@dataclass
class Fault:
    method: str
    path: re.Pattern
    status: int
    times: int
    headers: dict[str, str] = field(default_factory=dict)
    hits: int = 0


@attrs.define(kw_only=True)
class _Handler(kmock.KubernetesEmulator):
    faults: list = attrs.field(factory=list)
    pod_logs: dict = attrs.field(factory=dict)
    counts: collections.Counter = attrs.field(factory=collections.Counter)

    async def _handle(self, request):
        resource = request.resource.plural if request.resource is not None else "?"
        verb = _VERBS.get(request.action.name if request.action else "", str(request.method).lower())
        key = f"{verb} {resource}" + (f"/{request.subresource}" if request.subresource else "")
        self.counts[key] += 1
        # kmock matches each request by scanning its whole request log (O(n) per request, O(n^2) per run); we
        # count requests ourselves, so keep only the current one there.
        del self._requests[:-1]
        path = request.url.path
        for fault in self.faults:
            if fault.hits < fault.times and fault.method == str(request.method.value).upper() \
                    and fault.path.search(path):
                fault.hits += 1
                body = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": fault.status,
                        "reason": "Injected", "message": f"injected HTTP {fault.status}"}
                return aiohttp.web.json_response(body, status=fault.status, headers=fault.headers)
        if request.action is not None and request.action.name == "CREATE" and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})      # what a real API server fills in
            meta.setdefault("namespace", request.namespace)
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
        if request.subresource == "log":
            text = self.pod_logs.get((request.name, request.params.get("container")), "")
            tail = int(request.params.get("tailLines") or 0)
            if tail:
                text = "".join(text.splitlines(keepends=True)[-tail:])
            limit = int(request.params.get("limitBytes") or 0)
            return aiohttp.web.Response(text=text[:limit] if limit else text)
        return await super()._handle(request)


class Emulator:
    """Start with ``with Emulator() as emu:``; ``emu.url`` is the API server's base URL."""

    def __init__(self):
        self.url = ""
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="k8s-emulator", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.handler: _Handler | None = None

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with _Handler() as handler, kmock.Server(handler) as server:
            for r in RESOURCES:
                handler.resources[r] = {}
            self.handler, self.url = handler, str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> Emulator:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the kmock emulator did not start within 30 s")
        return self

    def __exit__(self, *exc) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def inject(self, method: str, path: str, status: int, *, times: int = 1,
               headers: dict[str, str] | None = None) -> Fault:
        fault = Fault(method.upper(), re.compile(path), status, times, dict(headers or {}))
        self.handler.faults.append(fault)
        return fault

    def set_log(self, pod: str, container: str, text: str) -> None:
        self.handler.pod_logs[(pod, container)] = text

    @property
    def counts(self) -> collections.Counter:
        return self.handler.counts

    def objects(self, plural: str) -> list[dict]:
        """Live objects of one core/networking resource (for assertions)."""
        return [obj.raw for (res, _, _), obj in list(self.handler.objects.items())
                if res.plural == plural and not obj.deleted]


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKubelet:
    """Plays scheduler and kubelet against the emulator: full status writes (as the kubelet's are) + Events."""

    def __init__(self, url: str, namespace: str, emulator: Emulator | None = None):
        from kubernetes import client

        conf = client.Configuration()
        conf.host = url
        self.core = client.CoreV1Api(client.ApiClient(conf))
        self.ns, self.emulator = namespace, emulator
        self._n = 0

    def pod(self, name: str) -> dict:
        return json.loads(self.core.read_namespaced_pod(name, self.ns, _preload_content=False).data)

    def _statuses(self, pod: dict) -> tuple[list[dict], list[dict]]:
        st = pod.get("status") or {}
        init = st.get("initContainerStatuses") or [self._blank(c) for c in pod["spec"].get("initContainers", [])]
        main = st.get("containerStatuses") or [self._blank(c) for c in pod["spec"]["containers"]]
        return init, main

    @staticmethod
    def _blank(c: dict) -> dict:
        return {"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
                "started": False, "state": {"waiting": {"reason": "PodInitializing"}}}

    def _write(self, name: str, status: dict) -> None:
        self.core.patch_namespaced_pod_status(name, self.ns, {"status": status}, _preload_content=False)

    def _container(self, name: str, container: str, state: dict, *, phase: str = "Pending", **extra) -> None:
        pod = self.pod(name)
        init, main = self._statuses(pod)
        for cs in init + main:
            if cs["name"] == container:
                cs["state"] = state
                cs.update(extra)
        self._write(name, {"phase": phase, "initContainerStatuses": init, "containerStatuses": main})

    def event(self, name: str, reason: str, message_: str, type_: str = "Normal") -> None:
        self._n += 1
        self.core.create_namespaced_event(self.ns, {
            "metadata": {"name": f"{name}.{self._n:04d}", "namespace": self.ns},
            "involvedObject": {"kind": "Pod", "name": name, "namespace": self.ns, "apiVersion": "v1"},
            "reason": reason, "message": message_, "type": type_, "count": 1, "source": {"component": "kubelet"},
            "firstTimestamp": _now(), "lastTimestamp": _now()}, _preload_content=False)

    # --- scheduler
    def schedule(self, name: str, node: str = "node-1") -> None:
        self.core.patch_namespaced_pod(name, self.ns, {"spec": {"nodeName": node}}, _preload_content=False)
        self._write(name, {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]})
        self.event(name, "Scheduled", f"Successfully assigned {self.ns}/{name} to {node}")

    def unschedulable(self, name: str) -> None:
        msg = "0/3 nodes are available: 3 Insufficient memory."
        self._write(name, {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg}]})
        self.event(name, "FailedScheduling", msg, "Warning")

    # --- kubelet
    def pull_error(self, name: str, container: str, reason: str = "ImagePullBackOff") -> None:
        self.event(name, "Failed", f"Failed to pull image: {reason}", "Warning")
        self._container(name, container, {"waiting": {"reason": reason, "message": "manifest unknown"}})

    def start(self, name: str, container: str, *, started_at: str | None = None, phase: str = "Pending",
              digest: str = "sha256:" + "ab" * 32) -> None:
        pod = self.pod(name)
        image = next(c["image"] for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
                     if c["name"] == container)
        self.event(name, "Pulled", f"Container image {image!r} already present on machine")
        self._container(name, container, {"running": {"startedAt": started_at or _now()}}, phase=phase,
                        started=True, imageID=f"{image.split('@')[0]}@{digest}")
        self.event(name, "Started", f"Started container {container}")

    def finish(self, name: str, container: str, *, exit_code: int = 0, outputs: dict[str, bytes] | None = None,
               wrapped_exit: int | None = None, reason: str = "Completed", msg: str | None = None,
               phase: str = "Pending", log: str = "") -> None:
        """``wrapped_exit``: the phase's own exit code as the wrapper reports it in the termination message."""
        text = msg if msg is not None else (message(wrapped_exit, outputs) if wrapped_exit is not None else "")
        if self.emulator is not None and log:
            self.emulator.set_log(name, container, log)
        self._container(name, container, {"terminated": {"exitCode": exit_code, "reason": reason, "message": text,
                                                         "startedAt": _now(), "finishedAt": _now()}},
                        phase=phase, started=False)

    def fail_pod(self, name: str, reason: str, msg: str) -> None:
        """Pod-level failure as the kubelet reports it: phase Failed, the reason, and every running container
        killed (exit 137), all in one status write."""
        pod = self.pod(name)
        init, main = self._statuses(pod)
        for cs in init + main:
            if "running" in (cs.get("state") or {}):
                cs["state"] = {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": _now(),
                                              "finishedAt": _now()}}
        self._write(name, {"phase": "Failed", "reason": reason, "message": msg, "initContainerStatuses": init,
                           "containerStatuses": main})
        self.event(name, reason, msg, "Warning")
