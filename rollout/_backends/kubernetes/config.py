"""``KubernetesConfig``: every knob of the Kubernetes backend in one object (no environment reads here)."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MANAGED_BY = "openforge"


class Toleration(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str | None = None
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


class KubernetesConfig(BaseModel):
    """Where and how rollout pods run.

    ``proxy_url`` is the proxy as a pod reaches it (a Service DNS name); ``proxy_pod_labels`` /
    ``proxy_namespace`` / ``proxy_pod_port`` select the proxy pods for the NetworkPolicy (the pod port, which can
    differ from the Service port). Graces say how long a condition may last before it becomes an infra error.
    """

    model_config = ConfigDict(extra="forbid")

    namespace: str = "openforge-rollouts"
    context: str | None = None                     # kubeconfig context; None: in-cluster config, else current
    service_account: str | None = None             # None: the namespace's default (its token is never mounted)
    image_pull_secrets: list[str] = []
    node_selector: dict[str, str] = {}
    tolerations: list[Toleration] = []
    max_pods_in_flight: int = Field(default=256, ge=1)
    proxy_url: str = "http://openforge-proxy.openforge.svc:8000"
    proxy_namespace: str = "openforge"
    proxy_pod_labels: dict[str, str] = {"app.kubernetes.io/name": "openforge-proxy"}
    proxy_pod_port: int | None = Field(default=None, ge=1, le=65535)   # None: the port of proxy_url
    allow_dns: bool = True                          # proxy_url names a Service: pods must resolve it
    default_image: str = "python:3.12-slim"
    image_digests: dict[str, str] = {}              # image ref -> sha256:...; pinned in manifests
    image_provides: list[str] = []                  # sandbox paths the image already has (not shipped)
    read_only_root_fs: bool = False
    run_as_user: int = Field(default=1000, ge=1)            # harness, services, seed
    verifier_run_as_user: int = Field(default=1001, ge=1)   # the verifier alone (uid and gid)
    qps: float = Field(default=50.0, gt=0)          # client-side token bucket (requests per second)
    burst: int = Field(default=100, ge=1)
    max_retries: int = Field(default=6, ge=0)       # 429 / 5xx / connection errors
    backoff_base_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)
    request_timeout_s: float = Field(default=30.0, gt=0)
    watch_timeout_s: int = Field(default=300, ge=1)  # server-side watch timeout; the watch is then re-opened
    image_pull_grace_s: float = Field(default=30.0, ge=0)
    unschedulable_grace_s: float = Field(default=120.0, ge=0)
    deadline_grace_s: float = Field(default=15.0, ge=0)   # past a phase's timeout before the pod is deleted
    deadline_backstop_s: int = Field(default=1800, ge=0)  # activeDeadlineSeconds = sum of phase timeouts + this
    configmap_max_bytes: int = Field(default=900_000, ge=1024)
    phase_log_bytes: int = Field(default=1 << 20, ge=0)   # container log bytes returned as a phase's stdout
    service_cpus: float = Field(default=0.1, gt=0)
    service_memory_mb: int = Field(default=256, ge=16)

    @field_validator("proxy_url")
    @classmethod
    def _http(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL such as http://openforge-proxy.openforge.svc:8000")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _verifier_apart(self) -> KubernetesConfig:
        if self.verifier_run_as_user == self.run_as_user:
            raise ValueError(f"verifier_run_as_user={self.verifier_run_as_user} equals run_as_user: the verifier "
                             f"must run as another uid than the harness, so nothing the harness owns is its own; "
                             f"pick two different uids (defaults 1000 and 1001)")
        return self

    @property
    def proxy_port(self) -> int:
        if self.proxy_pod_port:
            return self.proxy_pod_port
        parts = urlsplit(self.proxy_url)
        return parts.port or (443 if parts.scheme == "https" else 80)
