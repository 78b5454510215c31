"""One shared pod watch per namespace + label selector, feeding every ``run_phase`` waiter.

A watch per pod would cost the API server one long-lived stream per rollout (1,000 rollouts: 1,000 watches); this
keeps one. The thread lists once, then watches from the list's resourceVersion; when the stream ends (server-side
``timeoutSeconds``) it re-watches, and on an error it backs off and lists again. Waiters block on a Condition that
every event notifies. The last object seen for a pod is kept after its deletion (``describe`` needs it).
"""

from __future__ import annotations

import logging
import threading
import time

from .api import Api, ApiError

log = logging.getLogger(__name__)


def selector_string(selector: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def matches(obj: dict, selector: dict[str, str]) -> bool:
    """Client-side check of an equality selector (servers filter too; emulators may not)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


class PodWatcher:
    def __init__(self, api: Api, namespace: str, selector: dict[str, str]):
        self.api, self.namespace, self.selector = api, namespace, selector
        self.cond = threading.Condition()
        self.watches_opened = 0
        self.events_seen = 0
        self._last: dict[str, dict] = {}
        self._deleted: set[str] = set()
        self._tracked: set[str] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._watch = None

    # --- what waiters use
    def track(self, name: str, obj: dict | None = None) -> None:
        with self.cond:
            self._tracked.add(name)
            self._deleted.discard(name)
            if obj is not None:
                self._last[name] = obj
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="openforge-k8s-watch", daemon=True)
                self._thread.start()

    def forget(self, name: str) -> None:
        with self.cond:
            self._tracked.discard(name)
            self._last.pop(name, None)
            self._deleted.discard(name)

    def state(self, name: str) -> tuple[dict | None, bool]:
        """(last object seen, deleted?)"""
        with self.cond:
            return self._last.get(name), name in self._deleted

    def wait(self, timeout: float) -> None:
        with self.cond:
            self.cond.wait(timeout)

    def close(self) -> None:
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --- the thread
    def _apply(self, kind: str, obj: dict) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name or not matches(obj, self.selector):
            return
        with self.cond:
            self.events_seen += 1
            if name not in self._tracked:
                return
            self._last[name] = obj
            if kind == "DELETED":
                self._deleted.add(name)
            self.cond.notify_all()

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        sel = selector_string(self.selector)
        delays = self.api.backoff()
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listing = self.api.call("list", "pods", self.api.core.list_namespaced_pod, self.namespace,
                                            label_selector=sel)
                    for item in listing.get("items", []):
                        self._apply("MODIFIED", item)
                    version = (listing.get("metadata") or {}).get("resourceVersion") or ""
                self.api.bucket.take()
                self.api.count("watch pods")
                self.watches_opened += 1
                self._watch = w = watch.Watch()
                kwargs = {"resource_version": version} if version and version.isdigit() else {}
                for event in w.stream(self.api.core.list_namespaced_pod, self.namespace, label_selector=sel,
                                      timeout_seconds=self.api.cfg.watch_timeout_s, deserialize=False,
                                      allow_watch_bookmarks=True,
                                      _request_timeout=(10, self.api.cfg.watch_timeout_s + 30), **kwargs):
                    obj = event.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        version = rv
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self._apply(event["type"], obj)
                    if self._stop.is_set():
                        break
                delays.reset()
            except (ApiError, ApiException, HTTPError, OSError, ValueError) as exc:
                if self._stop.is_set():
                    break
                log.warning("pod watch in %s failed (%s); listing again after a backoff", self.namespace, exc)
                version = None
                time.sleep(delays.next())
