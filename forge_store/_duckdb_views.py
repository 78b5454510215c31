"""DuckDB over the store: the live database (SQLite or PostgreSQL, read-only) or a Parquet snapshot (a folder or
an ``s3://BUCKET/PREFIX`` URL that ``openforge store snapshot --to`` wrote).

``connect(url_or_snapshot, settings)`` returns a DuckDB connection with one view per table (JSON columns typed JSON,
timestamps TIMESTAMP in UTC (no zone attached, so results need no pytz), booleans BOOLEAN, whatever the source) and these analysis views:

* ``rollouts``: every rollout plus ``latency_s``, ``harness_name``, ``harness_version``, ``domain`` and the reward
  that counts (``reward``, ``reward_source``): rewards are append-only, the latest by ingest order wins, whatever
  its source (the store's one rule, :mod:`forge_store._rewards`).
* ``latest_rewards(sources)``, a table macro: the reward that counts per rollout when only ``sources`` count, e.g.
  ``SELECT r.id, l.value FROM rollouts r LEFT JOIN latest_rewards(['verifier']) l ON l.rollout_id = r.id``;
  ``latest_rewards()`` takes every source (what ``rollouts.reward`` shows).
* ``calls``: every call (token arrays stay packed BLOBs; ``n_prompt_tokens`` / ``n_completion_tokens`` count them).
* ``tool_calls``: one row per tool call of an assistant response: ``call_id``, ``rollout_id``, ``seq``,
  ``tool_index``, ``tool_call_id``, ``tool_name``, ``arguments`` (text as sent), ``arguments_json_ok``.
* ``rewards`` (every row, with ``is_latest``: the row that counts when every source does), ``exclusions``,
  ``exports``, ``tasks``, ``harnesses``, ``policy_versions``.
* ``samples``: one row per model call with what token-level training would see of it: ids, rollout, policy
  version, token counts, ``token_exact``, ``finish_reason`` and the rollout's latest reward. It is a view over
  ``calls``, not over exported shards: export shards live in the export's folder (``exports.out_dir``) and can be
  read with ``read_parquet`` directly.

The sqlite / postgres scanners cannot be INSTALLed offline: they come from the PyPI packages
``duckdb-extension-sqlite-scanner`` and ``duckdb-extension-postgres-scanner`` (``pip install 'openforge[dashboards]'``)
and are LOADed by file path. So is httpfs, for a snapshot at an ``s3://`` URL (``duckdb-extension-httpfs``, in
``openforge[s3]``): its manifest is read through the store's object-store client, and DuckDB gets a temporary
(in-memory, never written) S3 secret built from the same ``Settings`` (``OPENFORGE_S3_*`` / ``AWS_*``).
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import duckdb
import sqlalchemy as sa

from . import _schema as schema
from ._engine import bind_project, project_of, redact_url
from ._errors import SchemaMismatch, StoreError, StoreURLError
from ._objstore import ObjectNotFound, is_url, open_location
from ._rewards import DUCKDB_VIEWS as REWARD_VIEWS
from ._settings import Settings, get_settings
from ._tombstones import NOT_COPIED

ANALYSIS_VIEWS = ("rollouts", "calls", "tool_calls", "rewards", "samples", "exclusions", "exports", "tasks",
                  "harnesses", "policy_versions")


def _extension(name: str, extra: str = "dashboards") -> str:
    pkg = f"duckdb_extension_{name}"
    try:
        mod = importlib.import_module(pkg)
    except ImportError:
        raise StoreError(
            f"DuckDB extension {name} is not installed: it ships in the PyPI package {pkg.replace('_', '-')} "
            f"(version {duckdb.__version__}); run pip install 'openforge[{extra}]'") from None
    files = sorted(Path(mod.__file__).parent.rglob(f"{name}.duckdb_extension"))
    wanted = [f for f in files if f.parent.name == f"v{duckdb.__version__}"] or files
    if not wanted:
        raise StoreError(f"package {pkg} holds no {name}.duckdb_extension file: reinstall it at version "
                         f"{duckdb.__version__}")
    return str(wanted[-1])


def _bound(url: sa.URL) -> str | None:
    """The project a store URL names (``?project=``), as the engine binds it."""
    return project_of(bind_project(url, url.render_as_string(hide_password=True)))


def _pg_conninfo(url: sa.URL) -> str:
    parts = {"host": url.host, "port": url.port, "user": url.username, "password": url.password,
             "dbname": url.database}
    return " ".join(f"{k}={v}" for k, v in parts.items() if v is not None)


def _column_sql(col: sa.Column) -> str:
    name = f'"{col.name}"'
    t = col.type
    if isinstance(t, sa.JSON) or isinstance(getattr(t, "impl", None), sa.JSON):
        return f"CAST({name} AS JSON) AS {name}"
    if isinstance(t, (schema.UTCDateTime, sa.DateTime)):
        return f"CAST({name} AS TIMESTAMP) AS {name}"
    if isinstance(t, sa.Boolean):
        return f"CAST({name} AS BOOLEAN) AS {name}"
    return name


def _quote(value: str) -> str:
    """``value`` as a SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def _snapshot_views(con: duckdb.DuckDBPyConnection, source: str, manifest: dict, file_of) -> str:
    """One ``src`` view per table of a snapshot's ``manifest``; ``file_of(name)`` is where DuckDB reads a file."""
    files = {t: file_of(info["file"]) for t, info in manifest["tables"].items()}
    missing = [t.name for t in schema.Base.metadata.sorted_tables
               if t.name not in ("ingest_counter", *NOT_COPIED) and t.name not in files]
    if missing:
        raise SchemaMismatch(f"snapshot {source} lacks tables {missing}: it was written by an older OpenForge; "
                             "write a new one with `openforge store snapshot`")
    con.execute("CREATE SCHEMA src")
    for t, f in files.items():
        try:
            con.execute(f"CREATE VIEW src.\"{t}\" AS SELECT * FROM read_parquet({_quote(f)})")
        except duckdb.IOException as exc:  # a view reads its file's schema when it is created
            raise StoreError(f"snapshot {source}: DuckDB cannot read {f} ({str(exc).splitlines()[0]}). The manifest "
                             "lists it, so check that the file is still there and readable with these credentials, "
                             "or write a new snapshot with `openforge store snapshot`.") from None
    return "src.\"{table}\""


def _s3_secret(con: duckdb.DuckDBPyConnection, s: Settings) -> None:
    """Load httpfs and give DuckDB a temporary S3 secret from ``s``: the same server and credentials as obstore."""
    con.execute(f"LOAD {_quote(_extension('httpfs', extra='s3'))}")
    con.execute(f"SET http_timeout = {max(1, math.ceil(s.s3_timeout_s))}")
    con.execute(f"SET http_retries = {s.s3_max_retries}")
    opts = {"REGION": s.s3_region}
    for key, secret in (("KEY_ID", s.s3_access_key_id), ("SECRET", s.s3_secret_access_key),
                        ("SESSION_TOKEN", s.s3_session_token)):
        if secret is not None:
            opts[key] = secret.get_secret_value()
    sql = ""
    if s.s3_endpoint:
        endpoint = s.s3_endpoint.rstrip("/")
        opts["ENDPOINT"] = endpoint.split("://", 1)[-1]
        sql = f", URL_STYLE 'path', USE_SSL {'false' if endpoint.startswith('http://') else 'true'}"
    sql = ", ".join(f"{k} {_quote(v)}" for k, v in opts.items()) + sql
    try:
        con.execute(f"CREATE TEMPORARY SECRET openforge_s3 (TYPE s3, {sql})")
    except duckdb.Error:  # its text could quote the statement, and so the credentials: say what, not how
        raise StoreError("DuckDB refused the S3 secret built from the settings (OPENFORGE_S3_ENDPOINT, "
                         "OPENFORGE_S3_REGION, OPENFORGE_S3_ACCESS_KEY_ID ...): check their values") from None


def _attach_s3_snapshot(con: duckdb.DuckDBPyConnection, source: str, settings: Settings | None) -> str:
    settings = settings or get_settings()
    loc = open_location(source, settings)
    try:
        manifest = json.loads(loc.get_bytes("manifest.json"))
    except ObjectNotFound:
        raise StoreURLError(f"{source!r}: no snapshot there (no {loc.url}/manifest.json); pass the URL that "
                            "`openforge store snapshot --to s3://BUCKET/PREFIX` wrote, or a store URL") from None
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != "openforge-snapshot":
        raise StoreURLError(f"{loc.url}/manifest.json is not an OpenForge snapshot manifest; pass the URL that "
                            "`openforge store snapshot --to s3://BUCKET/PREFIX` wrote")
    _s3_secret(con, settings)
    return _snapshot_views(con, loc.url, manifest, lambda name: f"{loc.url}/{name}")


def _attach(con: duckdb.DuckDBPyConnection, source: str, settings: Settings | None = None) -> str:
    """Attach ``source``; return how a table is named in it (a format string with {table})."""
    path = Path(source).expanduser()
    if is_url(source):
        return _attach_s3_snapshot(con, source, settings)
    if "://" not in source:
        if not (path / "manifest.json").is_file():
            raise StoreURLError(f"{source!r} is neither a store URL nor a snapshot folder (no manifest.json there): "
                                "pass sqlite:///PATH, postgresql+psycopg://..., a folder written by "
                                "`openforge store snapshot --out DIR` or an s3:// URL written by "
                                "`openforge store snapshot --to`")
        manifest = json.loads((path / "manifest.json").read_text())
        return _snapshot_views(con, source, manifest, lambda name: str(path / name))
    try:
        url = sa.engine.make_url(source)
    except sa.exc.ArgumentError:
        raise StoreURLError(f"store URL {source!r} is not a database URL: use sqlite:///PATH or "
                            "postgresql+psycopg://USER@HOST:PORT/DB") from None
    backend = url.get_backend_name()
    if backend == "sqlite":
        db = Path(url.database or "").expanduser()
        if not db.is_file():
            raise StoreURLError(f"store {redact_url(source)}: no SQLite file at {db}; check the path")
        con.execute(f"LOAD '{_extension('sqlite_scanner')}'")
        con.execute(f"ATTACH '{db}' AS src (TYPE sqlite, READ_ONLY)")
    elif backend == "postgresql":
        con.execute(f"LOAD '{_extension('postgres_scanner')}'")
        try:
            project = _bound(url)   # a project is a schema of its own: the views see that schema only
            schema_opt = f", SCHEMA '{project}'" if project else ""
            con.execute(f"ATTACH '{_pg_conninfo(url)}' AS src (TYPE postgres, READ_ONLY{schema_opt})")
        except duckdb.Error as exc:
            raise StoreError(f"cannot attach {redact_url(source)} in DuckDB: {str(exc).splitlines()[0]}. Check the "
                             "URL and that the server is running.") from None
    else:
        raise StoreURLError(f"store URL {redact_url(source)}: backend {backend!r} is not supported by the DuckDB views")
    return "src.\"{table}\""


def connect(source: str, settings: Settings | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the store's views (see the module docstring). ``source``: a store URL, a snapshot
    folder or an ``s3://`` snapshot URL (reached with ``settings``' S3 options; default: the environment's)."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    ref = _attach(con, str(source), settings)
    try:
        con.execute("CREATE SCHEMA store")
        for table in schema.Base.metadata.sorted_tables:
            if table.name in ("ingest_counter", *NOT_COPIED):   # the store's bookkeeping, not data
                continue
            cols = ", ".join(_column_sql(c) for c in table.columns)
            con.execute(f'CREATE VIEW store."{table.name}" AS SELECT {cols} FROM {ref.format(table=table.name)}')
        _check_schema(con, source)
        for sql in _VIEWS:
            con.execute(sql)
    except duckdb.CatalogException as exc:
        raise SchemaMismatch(f"{redact_url(str(source))} does not have this OpenForge's tables "
                             f"({str(exc).splitlines()[0]}): run `openforge db upgrade --store URL`") from None
    return con


def _check_schema(con: duckdb.DuckDBPyConnection, source: str) -> None:
    for table in ("rollouts", "calls"):
        con.execute(f'SELECT * FROM store."{table}" LIMIT 0')


_VIEWS = [
    *REWARD_VIEWS,  # the latest_rewards(sources) macro and the rewards view
    "CREATE VIEW exclusions AS SELECT * FROM store.exclusions",
    "CREATE VIEW exports AS SELECT * FROM store.exports",
    "CREATE VIEW tasks AS SELECT * FROM store.tasks",
    "CREATE VIEW harnesses AS SELECT * FROM store.harnesses",
    "CREATE VIEW policy_versions AS SELECT * FROM store.policy_versions",
    "CREATE VIEW calls AS SELECT * FROM store.calls",
    """CREATE VIEW rollouts AS
       SELECT r.*, epoch(r.ended_at - r.started_at) AS latency_s, h.name AS harness_name,
              h.version AS harness_version, t.domain, rw.value AS reward, rw.source AS reward_source
       FROM store.rollouts r
       LEFT JOIN store.harnesses h ON h.id = r.harness_id
       LEFT JOIN store.tasks t ON t.id = r.task_id
       LEFT JOIN latest_rewards() rw ON rw.rollout_id = r.id""",
    """CREATE VIEW tool_calls AS
       WITH x AS (
         SELECT c.id AS call_id, c.rollout_id, c.seq, c.policy_version_id, c.started_at,
                CAST(json_extract(c.response, '$.tool_calls') AS JSON[]) AS tcs
         FROM store.calls c
         WHERE json_type(json_extract(c.response, '$.tool_calls')) = 'ARRAY'),
       y AS (SELECT call_id, rollout_id, seq, policy_version_id, started_at,
                    unnest(tcs) AS tc, generate_subscripts(tcs, 1) - 1 AS tool_index FROM x)
       SELECT call_id, rollout_id, seq, policy_version_id, started_at, tool_index,
              json_extract_string(tc, '$.id') AS tool_call_id,
              json_extract_string(tc, '$.function.name') AS tool_name,
              json_extract_string(tc, '$.function.arguments') AS arguments,
              coalesce(try(json_type(CAST(json_extract_string(tc, '$.function.arguments') AS JSON)) = 'OBJECT'), false)
                AS arguments_json_ok
       FROM y""",
    """CREATE VIEW samples AS
       SELECT c.id AS call_id, c.rollout_id, c.seq, c.policy_version_id, r.task_id, r.harness_id,
              c.n_prompt_tokens, c.n_completion_tokens, c.token_exact, c.finish_reason, c.started_at,
              rw.value AS reward
       FROM store.calls c
       LEFT JOIN store.rollouts r ON r.id = c.rollout_id
       LEFT JOIN latest_rewards() rw ON rw.rollout_id = c.rollout_id""",
]
