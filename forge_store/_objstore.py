"""Where files go: a local folder or an ``s3://bucket/prefix`` URL, behind one small interface (``Location``).

Blobs, snapshots, lake tables and export shards are written through it, so each of them takes a URL wherever it
took a folder. Both kinds keep the same promises: a put is atomic (a reader sees the whole object or none: a local
file is written to a temporary name, fsynced and renamed; an S3 put is one PUT, or a multipart upload whose key
exists only once it completes), and writers put a manifest or marker LAST, so its presence proves completeness.

The S3 client is obstore (the Rust ``object_store`` crate, as used by DataFusion and others), chosen over boto3
because it is one self-contained wheel with no dependencies, does multipart uploads of files and conditional puts
(``mode="create"``, If-None-Match: content-addressed writes are idempotent in one round trip) itself, and retries
with a bounded back-off that we set from the settings (boto3 would need botocore's ~100 MB of service models and
our own multipart and streaming code). Credentials come from ``Settings`` (``OPENFORGE_S3_*`` or the standard
``AWS_*`` variables); when none are set, obstore's own chain (instance role, web identity) applies.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Protocol, runtime_checkable

from ._errors import StoreError
from ._settings import Settings, get_settings

SCHEMES = ("s3://", "s3a://")


class ObjectStoreError(StoreError):
    """An object-store request failed (unreachable server, refused credentials, missing bucket)."""


class ObjectNotFound(ObjectStoreError):
    """The named object does not exist."""


def is_url(target: str | os.PathLike) -> bool:
    """Whether ``target`` is an object-store URL (``s3://``) rather than a local path."""
    return isinstance(target, str) and target.startswith(SCHEMES)


@runtime_checkable
class Location(Protocol):
    """A folder-like place: keys are ``/``-separated paths relative to it."""

    url: str

    def child(self, rel: str) -> Location: ...

    def put_bytes(self, rel: str, data: bytes, *, create: bool = False) -> bool:
        """Write ``data`` atomically; with ``create``, keep an existing object and return False."""

    def put_file(self, rel: str, path: Path) -> None:
        """Upload a local file atomically (large files in parts; the key exists only once all are in)."""

    def get_bytes(self, rel: str) -> bytes:
        """The object's bytes; ``ObjectNotFound`` when absent."""

    def get_file(self, rel: str, path: Path) -> None:
        """Download the object to a local file."""

    def exists(self, rel: str) -> bool: ...

    def list(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix`` (relative to this location), sorted."""

    def delete(self, rel: str) -> None:
        """Remove the object; absent is fine."""


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


class LocalLocation:
    """A folder on this machine (the embedded default)."""

    def __init__(self, root: str | os.PathLike, *, fsync: bool = True):
        self.root = Path(root)
        self.url = str(self.root)
        self.fsync = fsync

    def child(self, rel: str) -> LocalLocation:
        return LocalLocation(self.root / rel, fsync=self.fsync)

    def _path(self, rel: str) -> Path:
        return self.root / rel if rel else self.root

    def put_bytes(self, rel: str, data: bytes, *, create: bool = False) -> bool:
        target = self._path(rel)
        if create and target.exists():
            return False
        self._atomic(target, lambda fh: fh.write(data))
        return True

    def _atomic(self, target: Path, write) -> None:
        """``write(file)`` into a temporary file beside ``target``, fsync, rename over it, fsync the folder."""
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                if self.fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        if self.fsync:
            dir_fd = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def put_file(self, rel: str, path: Path) -> None:
        with open(path, "rb") as src:
            self._atomic(self._path(rel), lambda fh: shutil.copyfileobj(src, fh, 1 << 20))

    def get_bytes(self, rel: str) -> bytes:
        try:
            return self._path(rel).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFound(f"{self._path(rel)} does not exist") from None

    def get_file(self, rel: str, path: Path) -> None:
        Path(path).write_bytes(self.get_bytes(rel))

    def exists(self, rel: str) -> bool:
        return self._path(rel).exists()

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix)
        if not base.exists():
            return []
        if base.is_file():
            return [prefix]
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith(".tmp-"))

    def delete(self, rel: str) -> None:
        self._path(rel).unlink(missing_ok=True)


class S3Location:
    """``s3://bucket/prefix`` on AWS S3 or any S3-compatible server (``Settings.s3_endpoint``)."""

    def __init__(self, url: str, settings: Settings | None = None, *, _store=None):
        for scheme in SCHEMES:
            if url.startswith(scheme):
                rest = url[len(scheme):]
                break
        else:
            raise ObjectStoreError(f"{url!r} is not an object-store URL: write s3://BUCKET/PREFIX")
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ObjectStoreError(f"{url!r} names no bucket: write s3://BUCKET/PREFIX")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.settings = settings or get_settings()
        self._store = _store if _store is not None else _s3_store(bucket, self.settings)

    def child(self, rel: str) -> S3Location:
        return S3Location(f"s3://{self.bucket}/{_join(self.prefix, rel)}", self.settings, _store=self._store)

    def _key(self, rel: str) -> str:
        return _join(self.prefix, rel)

    def _fail(self, op: str, rel: str, exc: Exception) -> ObjectStoreError:
        import obstore.exceptions as oe

        where = f"s3://{self.bucket}/{self._key(rel)}"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, (oe.NotFoundError, FileNotFoundError)):
            return ObjectNotFound(f"{where} does not exist")
        endpoint = self.settings.s3_endpoint or "AWS S3"
        atomic = "; a put is atomic, so no object was left under that name" if op in ("writing", "uploading to") else ""
        return ObjectStoreError(
            f"{op} {where} failed: {first}. Check that the object store at {endpoint} is reachable, that the "
            "bucket exists and that the credentials (OPENFORGE_S3_ACCESS_KEY_ID / AWS_ACCESS_KEY_ID) may use it, "
            f"then retry{atomic}.")

    def put_bytes(self, rel: str, data: bytes, *, create: bool = False) -> bool:
        import obstore
        import obstore.exceptions as oe

        try:
            obstore.put(self._store, self._key(rel), data, mode="create" if create else "overwrite",
                        use_multipart=False)
        except oe.AlreadyExistsError:
            return False
        except oe.NotSupportedError:  # a server without conditional puts: look first (a race writes same bytes)
            if self.exists(rel):
                return False
            return self.put_bytes(rel, data)
        except (oe.BaseError, OSError) as exc:
            raise self._fail("writing", rel, exc) from None
        return True

    def put_file(self, rel: str, path: Path) -> None:
        import obstore
        import obstore.exceptions as oe

        try:
            obstore.put(self._store, self._key(rel), Path(path), chunk_size=8 << 20, max_concurrency=4)
        except (oe.BaseError, OSError) as exc:
            raise self._fail("uploading to", rel, exc) from None

    def get_bytes(self, rel: str) -> bytes:
        import obstore
        import obstore.exceptions as oe

        try:
            return bytes(obstore.get(self._store, self._key(rel)).bytes())
        except (oe.BaseError, OSError) as exc:
            raise self._fail("reading", rel, exc) from None

    def get_file(self, rel: str, path: Path) -> None:
        import obstore
        import obstore.exceptions as oe

        try:
            with open(path, "wb") as fh:
                for chunk in obstore.get(self._store, self._key(rel)):
                    fh.write(chunk)
        except (oe.BaseError, OSError) as exc:
            Path(path).unlink(missing_ok=True)
            raise self._fail("downloading", rel, exc) from None

    def exists(self, rel: str) -> bool:
        import obstore
        import obstore.exceptions as oe

        try:
            obstore.head(self._store, self._key(rel))
        except (oe.NotFoundError, FileNotFoundError):
            return False
        except (oe.BaseError, OSError) as exc:
            raise self._fail("looking up", rel, exc) from None
        return True

    def list(self, prefix: str = "") -> list[str]:
        import obstore
        import obstore.exceptions as oe

        base = self._key(prefix)
        try:
            keys = [m["path"] for batch in obstore.list(self._store, prefix=base or None) for m in batch]
        except (oe.BaseError, OSError) as exc:
            raise self._fail("listing", prefix, exc) from None
        cut = len(self.prefix) + 1 if self.prefix else 0
        return sorted(k[cut:] for k in keys)

    def delete(self, rel: str) -> None:
        import obstore
        import obstore.exceptions as oe

        try:
            obstore.delete(self._store, self._key(rel))
        except (oe.NotFoundError, FileNotFoundError):
            return
        except (oe.BaseError, OSError) as exc:
            raise self._fail("deleting", rel, exc) from None


def _s3_store(bucket: str, s: Settings):
    try:
        from obstore.store import S3Store
    except ImportError:
        raise ObjectStoreError("s3:// locations need obstore: pip install 'openforge[s3]'") from None
    config: dict = {"region": s.s3_region}
    if s.s3_endpoint:
        config["endpoint"] = s.s3_endpoint
        config["virtual_hosted_style_request"] = False  # path style: what self-hosted servers serve
    for key, secret in (("access_key_id", s.s3_access_key_id), ("secret_access_key", s.s3_secret_access_key),
                        ("session_token", s.s3_session_token)):
        if secret is not None:
            config[key] = secret.get_secret_value()
    timeout = timedelta(seconds=s.s3_timeout_s)
    client = {"timeout": timeout, "connect_timeout": timedelta(seconds=min(5.0, s.s3_timeout_s)),
              "allow_http": bool(s.s3_endpoint and s.s3_endpoint.startswith("http://"))}
    retry = {"max_retries": s.s3_max_retries, "retry_timeout": timeout,
             "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=2), "base": 2}}
    return S3Store(bucket, config=config, client_options=client, retry_config=retry)


def open_location(target: str | os.PathLike, settings: Settings | None = None, *, fsync: bool = True) -> Location:
    """``s3://bucket/prefix`` -> ``S3Location``; anything else is a local folder."""
    if is_url(target):
        return S3Location(str(target), settings)
    return LocalLocation(target, fsync=fsync)
