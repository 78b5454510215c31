"""Issue 35's end-to-end proof: a secret that no redaction rule matches, recorded through the real proxy into SQLite
(local blobs) and into PostgreSQL with an S3 blob store (SeaweedFS), snapshotted, lake-exported and exported as
shards; after ``openforge erase --pattern`` a byte search of the database (file, or a dump), the blob store, the
proxy's folder (journal, dead letters, ledger), the snapshot and lake and the remaining shards finds it nowhere; the
export taken before it verifies, the one that held it fails naming the erasure."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import typer
from typer.testing import CliRunner

from forge_store import Selection, erase, open_location, open_store, tombstones
from forge_store._erase_cli import erase_command
from forge_store._lake import lake_snapshot
from forge_store._snapshot import snapshot
from learner import ExportConfig, export, export_to, verify
from tests.proxy_fixtures import make_proxy

SECRET = "acme-cust-7Q4Z-99XK-1188-secretish"   # no rule of proxy redaction matches it


def _record(px, *, secret: bool) -> None:
    st = px.store
    st.register_task("t1")
    group, rids = ("g1", ("r-secret", "r-x")) if secret else ("g2", ("r-a", "r-b"))
    st.create_group(group, task_id="t1", target_size=2)
    for rid in rids:
        client = px.client(px.register(rid, group_id=group, task_id="t1"))
        text = f"ticket for customer {SECRET}: fix the config" if rid == "r-secret" else f"fix config {rid}"
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
        px.end(rid, "success")
        blob = st.put_blob(f"verifier log: {SECRET if rid == 'r-secret' else rid}".encode(), "text/plain")
        st.add_reward(rid, 1.0 if rid in ("r-secret", "r-a") else 0.0, evidence_blob=blob)
    assert st.flush(30)


def _holds(name: str, data: bytes, secret: str = SECRET) -> bool:
    """The secret in the bytes, or (Parquet pages are compressed) in the values a Parquet file decodes to."""
    if secret.encode() in data:
        return True
    if name.endswith(".parquet"):
        import io

        import pyarrow.parquet as pq

        return secret in str(pq.read_table(io.BytesIO(data)).to_pylist())
    return False


def _grep(*roots, secret: str = SECRET) -> list[str]:
    return [str(p) for root in roots for p in ([root] if root.is_file() else root.rglob("*"))
            if p.is_file() and _holds(p.name, p.read_bytes(), secret)]


def _grep_s3(url: str, settings) -> list[str]:
    loc = open_location(url, settings)
    return [k for k in loc.list() if _holds(k, loc.get_bytes(k))]


def _through_the_proxy(up, tmp_path, store_url, copies: dict, full_at=None, **settings):
    px, serve = make_proxy(up, tmp_path, store_url=store_url, **settings)
    try:
        _record(px, secret=False)
        st = px.store
        early = export(st, tmp_path / "shards-early", ExportConfig(format="sft"))
        _record(px, secret=True)
        call = px.calls("r-secret")[0]
        assert SECRET in str(call.messages) and not (call.metadata or {}).get("redacted")   # it slipped through
        full = export_to(st, full_at or tmp_path / "shards-full", ExportConfig(format="sft"))
        snapshot(st.engine, copies["snapshot"], settings=st.settings)
        lake_snapshot(st.engine, copies["lake"], settings=st.settings)
        if full_at is None:
            assert _grep(tmp_path / "shards-full")   # the shard holds the text
            shutil.copytree(tmp_path / "shards-full", tmp_path / "kept-aside")   # to verify after --shards
        else:
            loc, aside = open_location(full_at, st.settings), tmp_path / "kept-aside"
            aside.mkdir()
            for key in loc.list():   # a copy to verify after --shards deleted the export
                loc.get_file(key, aside / key)
    finally:
        serve.stop()
        px.store.close()
    return early, full


def _check_after(st, tmp_path, full) -> None:
    [t] = tombstones(st)
    assert t.state == "done" and t.counts["rollouts"] == 1
    assert verify(tmp_path / "shards-early" / "manifest.json", st)["ok"]
    res = verify(tmp_path / "kept-aside" / "manifest.json", st)
    assert not res["ok"] and f"erasure {t.id}" in res["problems"][0]
    assert [i.id for i in st.iter_rollouts() if i.id == "r-x"] == ["r-x"]   # its group's other rollout stays
    again = export(st, tmp_path / "shards-again", ExportConfig(format="sft"))
    assert again["exclusions"].get("erased") == 1


def test_sqlite_local_blobs(up, tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'proxy.sqlite'}"
    copies = {"snapshot": tmp_path / "snap", "lake": tmp_path / "lake"}
    early, full = _through_the_proxy(up, tmp_path, url, copies)
    home = tmp_path / "proxy-home"
    monkeypatch.setenv("OPENFORGE_HOME", str(home))
    (tmp_path / "pattern").write_text(SECRET + "\n")
    app = typer.Typer()
    app.command("erase")(erase_command)
    app.command("other")(lambda: None)
    db = [p for p in tmp_path.glob("proxy.sqlite*")]
    before = {"db": _grep(*db), "blobs": _grep(home / "blobs"), "journal": _grep(home / "journal"),
              "snap": _grep(tmp_path / "snap"), "lake": _grep(tmp_path / "lake")}
    assert all(before.values()), before   # every copy held it: the search can find it
    r = CliRunner().invoke(app, ["erase", "--pattern-file", str(tmp_path / "pattern"), "--reason", "customer data",
                                 "--yes", "--shards", "--store", url])
    assert r.exit_code == 0, r.output
    assert f"export {full['export_id']}" in r.output and "deleted" in r.output
    assert not (tmp_path / "shards-full" / "manifest.json").exists()
    assert _grep(*db, home, tmp_path / "snap", tmp_path / "lake", tmp_path / "shards-early") == []
    st = open_store(url)
    try:
        _check_after(st, tmp_path, full)
    finally:
        st.close()


def test_postgres_with_s3_blobs(up, tmp_path, pg_database, seaweedfs, s3_url):
    s3 = dict(s3_endpoint=seaweedfs.endpoint, s3_access_key_id=seaweedfs.access_key,
              s3_secret_access_key=seaweedfs.secret_key, s3_max_retries=1, s3_timeout_s=10.0)
    copies = {"snapshot": f"{s3_url}/snap", "lake": f"{s3_url}/lake"}
    early, full = _through_the_proxy(up, tmp_path, pg_database, copies, full_at=f"{s3_url}/shards-full",
                                     blob_url=f"{s3_url}/blobs", **s3)
    settings = seaweedfs.settings(home=tmp_path / "proxy-home", blob_url=f"{s3_url}/blobs")
    before = _grep_s3(s3_url, settings)
    assert {k.split("/")[0] for k in before} == {"blobs", "snap", "lake", "shards-full"}, before   # every copy
    st = open_store(pg_database, settings=settings)
    try:
        r = erase(st, Selection(pattern=SECRET), reason="customer data", apply=True, shards=True)
        assert r.counts["blobs"] == 1 and {c["kind"] for c in r.copies} == {"snapshot", "lake"}
        assert _grep_s3(s3_url, settings) == []
        assert open_location(f"{s3_url}/shards-full", settings).list() == []   # --shards deleted the export
        assert _grep(tmp_path / "proxy-home", tmp_path / "shards-early") == []
        assert SECRET.encode() not in _pg_dump(pg_database)
        _check_after(st, tmp_path, full)
    finally:
        st.close()


def _pg_dump(url: str) -> bytes:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if shutil.which("pg_dump") is None:
        pytest.fail("pg_dump is needed to search a PostgreSQL dump")
    return subprocess.run(["pg_dump", "-h", u.host or "127.0.0.1", "-p", str(u.port or 5432), "-U", u.username,
                           u.database], capture_output=True, check=True).stdout
