"""The store's settings (and the orchestrator's folders); the proxy's are ``proxy.ProxySettings``.

Every value can be set by an ``OPENFORGE_*`` environment variable or passed explicitly. One scheme for every part:
a part's settings are a pydantic-settings class of its own, read under the ``OPENFORGE_`` prefix (the proxy's under
``OPENFORGE_PROXY_``), and docs/configuration.md lists every variable (a test keeps it complete). Nothing is read at
import time: call :func:`get_settings` (or build :class:`Settings` yourself) when you need them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OPENFORGE_", extra="forbid", populate_by_name=True)

    home: Path = Field(
        default=Path(".openforge"),
        description="Project-local folder for the embedded store: SQLite file, blobs, journal, snapshots.",
    )
    store_url: str | None = Field(
        default=None,
        description="Database URL: sqlite:///PATH or postgresql+psycopg://USER@HOST/DB. Default: HOME/store.sqlite.",
    )
    blob_dir: Path | None = Field(default=None, description="Blob folder. Default: HOME/blobs.")
    journal_dir: Path | None = Field(default=None, description="Journal folder. Default: HOME/journal/<name>.")
    writer_batch_size: int = Field(default=512, ge=1, description="Most journal entries the writer puts in one transaction.")
    writer_linger_s: float = Field(default=0.005, ge=0, description="How long the writer lets a batch gather.")
    drain_linger_s: float = Field(
        default=0.05, ge=0, description="How long a drain process (the proxy's database writer) lets a batch gather; "
        "a flush wakes it at once.")
    writer_retry_max_s: float = Field(default=5.0, gt=0, description="Longest back-off between retries while the database is down.")
    journal_fsync: bool = Field(default=True, description="fsync the journal before acknowledging a write.")
    writer_stall_s: float = Field(
        default=10.0, gt=0, description="A database write that has not returned for this long while writes wait "
        "counts as the database down (health: db_down_s), a stalled database as much as a refusing one.")
    auto_upgrade: bool = Field(
        default=True, description="Create the schema when a store is opened on an empty database."
    )

    # Object storage (issue 23): blobs, snapshots, lake tables and export shards at an ``s3://bucket/prefix`` URL.
    # Credentials come from here (or the standard AWS_* variables, read through this object), never from a file
    # OpenForge writes, and are never stored.
    blob_url: str | None = Field(
        default=None, description="Where blobs live when not in blob_dir: s3://BUCKET/PREFIX (an S3-compatible "
        "object store) or a folder. Default: blob_dir.")
    s3_endpoint: str | None = Field(
        default=None, validation_alias=AliasChoices("OPENFORGE_S3_ENDPOINT", "AWS_ENDPOINT_URL"),
        description="S3 endpoint URL (SeaweedFS, MinIO, R2, ...; http:// is allowed for it). Default: AWS S3.")
    s3_region: str = Field(
        default="us-east-1", validation_alias=AliasChoices("OPENFORGE_S3_REGION", "AWS_REGION"),
        description="S3 region.")
    s3_access_key_id: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("OPENFORGE_S3_ACCESS_KEY_ID",
                                                    "AWS_ACCESS_KEY_ID"),
        description="S3 access key id. Default: the client's own chain (instance role, AWS config).")
    s3_secret_access_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("OPENFORGE_S3_SECRET_ACCESS_KEY",
                                                    "AWS_SECRET_ACCESS_KEY"),
        description="S3 secret access key.")
    s3_session_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("OPENFORGE_S3_SESSION_TOKEN",
                                                    "AWS_SESSION_TOKEN"),
        description="S3 session token (temporary credentials).")
    s3_max_retries: int = Field(
        default=3, ge=0, description="Retries of a failed S3 request (5xx, dropped connection) before it is an error.")
    s3_timeout_s: float = Field(
        default=60.0, gt=0, description="Longest one S3 request may take, and the longest retries may go on.")

    # The rollout orchestrator (``openforge run``).
    cache_dir: Path | None = Field(
        default=None,
        description="Installs that sandboxes see read-only (npm harnesses, the mini-swe-agent venv). Default: "
        "/var/cache/openforge as root (bubblewrap runs as nobody and cannot enter /root), else ~/.cache/openforge.",
    )
    sandbox_dir: Path | None = Field(
        default=None, description="Local sandboxes' folders. Default: /var/tmp/openforge/sandboxes as root (bubblewrap "
        "runs as nobody, which must reach it; a checkout under /root is private), else HOME/sandboxes.")
    vllm_cpu_cache: Path | None = Field(
        default=None, description="vLLM CPU environment and SmolLM2 model for `openforge demo` / `openforge train`. "
        "Default: ~/.cache/openforge/vllm-cpu.")

    def resolved_cache_dir(self) -> Path:
        import os

        if self.cache_dir:
            return self.cache_dir
        return Path("/var/cache/openforge") if os.geteuid() == 0 else Path.home() / ".cache" / "openforge"

    def resolved_sandbox_dir(self) -> Path:
        import os

        if self.sandbox_dir:
            return self.sandbox_dir.resolve()
        return Path("/var/tmp/openforge/sandboxes") if os.geteuid() == 0 else (self.home / "sandboxes").resolve()

    def resolved_store_url(self) -> str:
        return self.store_url or f"sqlite:///{(self.home / 'store.sqlite').resolve()}"

    def resolved_blob_dir(self) -> Path:
        return self.blob_dir or self.home / "blobs"

    def resolved_journal_dir(self, name: str = "default") -> Path:
        return self.journal_dir or self.home / "journal" / name


def get_settings(**overrides) -> Settings:
    """Settings from the environment, with explicit ``overrides`` taking precedence."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
