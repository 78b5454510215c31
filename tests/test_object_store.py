"""Object storage (issue 23) against a real S3-compatible server (SeaweedFS, started by the ``seaweedfs`` fixture):
blobs, snapshots, export shards + verify, credentials from settings, and a server that goes away mid-write."""

from __future__ import annotations

import json
import threading
import time

import pytest

from forge_store import (
    BlobCorrupt,
    BlobNotFound,
    ObjectBlobStore,
    ObjectNotFound,
    ObjectStoreError,
    Settings,
    open_blob_store,
    open_location,
    open_store,
)
from forge_store._snapshot import snapshot
from forge_store.testing import png_1px
from tests.doubles.seaweedfs import SeaweedFS
from tests.conftest import make_call


@pytest.mark.parametrize("kind", ["folder", "s3"])
def test_a_location_keeps_the_same_contract_in_a_folder_and_on_s3(kind, request, tmp_path):
    if kind == "s3":
        loc = open_location(request.getfixturevalue("s3_url"), request.getfixturevalue("s3_settings"))
    else:
        loc = open_location(tmp_path / "loc")
    assert loc.list() == [] and not loc.exists("a/b.bin")
    assert loc.put_bytes("a/b.bin", b"one", create=True) is True
    assert loc.put_bytes("a/b.bin", b"two", create=True) is False  # create keeps what is there
    assert loc.get_bytes("a/b.bin") == b"one"
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * (40 << 10))  # 10 MiB: two parts on S3
    loc.put_file("c/big.bin", big)
    loc.get_file("c/big.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == big.read_bytes()
    assert loc.list() == ["a/b.bin", "c/big.bin"] and loc.list("c") == ["c/big.bin"]
    assert loc.child("a").list() == ["b.bin"] and loc.child("a").get_bytes("b.bin") == b"one"
    loc.delete("a/b.bin")
    loc.delete("a/b.bin")  # absent is fine
    with pytest.raises(ObjectNotFound):
        loc.get_bytes("a/b.bin")
    assert loc.list() == ["c/big.bin"]


def test_blobs_on_s3_are_content_addressed_idempotent_and_verified(s3_url, s3_settings):
    blobs = ObjectBlobStore(open_location(s3_url, s3_settings))
    data = png_1px()
    sha = blobs.put(data)
    assert blobs.put(data) == sha and blobs.exists(sha) and blobs.get(sha) == data
    loc = open_location(s3_url, s3_settings)
    assert loc.list() == [f"{sha[:2]}/{sha[2:4]}/{sha}"]  # the local folder's layout, one object per content
    assert not blobs.exists("0" * 64)
    with pytest.raises(BlobNotFound, match="OPENFORGE_BLOB_URL"):
        blobs.get("0" * 64)
    loc.put_bytes(f"{sha[:2]}/{sha[2:4]}/{sha}", b"tampered")  # bytes changed behind the store's back
    with pytest.raises(BlobCorrupt, match=sha):
        blobs.get(sha)


def test_a_store_keeps_its_blobs_at_the_blob_url(s3_url, s3_settings):
    settings = s3_settings.model_copy(update={"blob_url": s3_url})
    assert isinstance(open_blob_store(settings), ObjectBlobStore)
    with open_store(settings=settings) as st:
        sha = st.put_blob(b"verifier log", media_type="text/plain")
        assert st.get_blob(sha) == b"verifier log"
    assert not (settings.home / "blobs").exists()  # nothing went to the local folder
    with open_store(settings=settings) as st:  # another process, same URL: the same bytes
        assert st.get_blob(sha) == b"verifier log"


def test_credentials_come_from_settings_and_environment(seaweedfs, s3_url, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweedfs.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweedfs.secret_key)
    monkeypatch.setenv("OPENFORGE_S3_ENDPOINT", seaweedfs.endpoint)
    env = Settings(home=tmp_path)
    assert env.s3_access_key_id.get_secret_value() == seaweedfs.access_key
    assert seaweedfs.secret_key not in repr(env)  # a secret never prints
    open_location(s3_url, env).put_bytes("k", b"v")
    wrong = seaweedfs.settings(s3_secret_access_key="not-the-secret")
    with pytest.raises(ObjectStoreError, match=r"writing s3://openforge/.*/k2 failed: .*credentials"):
        open_location(s3_url, wrong).put_bytes("k2", b"v")
    assert not open_location(s3_url, env).exists("k2")


def test_snapshot_to_s3_writes_every_table_then_the_manifest(s3_url, s3_settings, store_url, settings):
    with open_store(store_url, settings=settings) as st:
        st.start_rollout("r0", task_id="t")
        for i in range(6):
            st.record_call(make_call(f"c{i}", "r0", i))
        st.finish_rollout("r0", "success")
        local = snapshot(st.engine, settings.home / "snap")
        remote = snapshot(st.engine, s3_url, settings=s3_settings)
    assert remote == local  # the same bytes (hashes in the manifest) wherever they land
    loc = open_location(s3_url, s3_settings)
    assert json.loads(loc.get_bytes("manifest.json")) == remote
    for info in remote["tables"].values():
        assert loc.get_bytes(info["file"]) == (settings.home / "snap" / info["file"]).read_bytes()


def test_a_server_gone_mid_snapshot_is_a_clear_error_and_no_manifest(tmp_path, settings):
    server = SeaweedFS(tmp_path / "weed", buckets=("snaps",)).start()
    s3 = server.settings()
    uploaded = []
    try:
        with open_store(f"sqlite:///{tmp_path / 's.sqlite'}", settings=settings) as st:
            for i in range(4):
                st.record_call(make_call(f"c{i}", "r0", i))

            def kill_after_first(name: str) -> None:
                uploaded.append(name)
                if len(uploaded) == 1:
                    server.stop()  # the server goes away between two objects of one snapshot

            with pytest.raises(ObjectStoreError, match=r"s3://snaps/snap/.* failed: .*reachable"):
                snapshot(st.engine, "s3://snaps/snap", settings=s3, uploaded=kill_after_first)
            blobs = ObjectBlobStore(open_location("s3://snaps/blobs", s3))
            with pytest.raises(ObjectStoreError, match=r"writing s3://snaps/blobs/.* failed"):
                blobs.put(b"a screenshot")  # a blob write while the server is away: an error, never a silent loss
        server.start()  # back, same data: what was written is whole, and nothing claims to be complete
        loc = open_location("s3://snaps/snap", s3)
        assert len(uploaded) == 1 and loc.list() == [uploaded[0]]
        assert open_location("s3://snaps/blobs", s3).list() == []
        with pytest.raises(ObjectNotFound):
            loc.get_bytes("manifest.json")
    finally:
        server.stop()


def _stop_once_it_grows(server: SeaweedFS, by: int) -> threading.Thread:
    """Stop ``server`` as soon as its data folder has grown by ``by`` bytes (parts of an upload have landed)."""
    def size() -> int:
        return sum(p.stat().st_size for p in server.data_dir.rglob("*") if p.is_file())

    start = size()

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and size() - start < by:
            time.sleep(0.005)
        server.stop()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_a_server_gone_mid_multipart_upload_leaves_no_key(tmp_path):
    server = SeaweedFS(tmp_path / "weed", buckets=("big",)).start()
    s3 = server.settings(s3_max_retries=0, s3_timeout_s=5.0)
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * (384 << 10))  # 96 MiB: twelve 8 MiB parts
    loc = open_location("s3://big/x", s3)
    try:
        watcher = _stop_once_it_grows(server, 8 << 20)
        with pytest.raises(ObjectStoreError, match=r"uploading to s3://big/x/big.bin failed: .*reachable"):
            loc.put_file("big.bin", big)
        watcher.join()
        server.start()
        assert not loc.exists("big.bin") and loc.list() == []  # the parts that landed are no object
    finally:
        server.stop()


def _seed_groups(st) -> None:
    """Two GRPO groups of two finished, rewarded rollouts each (token-exact append-only calls)."""
    st.register_task("t1", source="s", verifier_hash="vh")
    st.register_policy_version("p1", model_name="m", global_step=1)
    for g, rewards in (("g1", (1.0, 0.0)), ("g2", (0.5, 1.0))):
        st.create_group(g, task_id="t1", target_size=2, policy_version_id="p1")
        for k, reward in enumerate(rewards):
            rid = f"{g}r{k}"
            st.start_rollout(rid, group_id=g, task_id="t1", policy_version_id="p1")
            prompt = [1, 2, 3]
            for t in range(2):
                comp = [100 + t, 101 + t]
                st.record_call(make_call(f"{rid}-c{t}", rid, t, prompt_ids=prompt, completion_ids=comp))
                prompt = prompt + comp + [50 + t]
            st.finish_rollout(rid, "success")
            st.add_reward(rid, reward)


def test_export_to_s3_is_the_folder_export_and_verify_rederives_it(s3_url, s3_settings, store_url, tmp_path):
    from learner import ExportConfig, ExportError, export_to, verify_at

    with open_store(store_url, settings=s3_settings) as st:
        _seed_groups(st)
        cfg = ExportConfig(format="verl")
        local = export_to(st, tmp_path / "local", cfg, record=False)
        order: list[str] = []
        remote = export_to(st, s3_url, cfg, uploaded=order.append)
        assert remote == local and order[-1] == "manifest.json"  # same manifest; the manifest went last
        loc = open_location(s3_url, s3_settings)
        for f in remote["files"]:
            assert loc.get_bytes(f["path"]) == (tmp_path / "local" / f["path"]).read_bytes()
        assert st.stats.exports()[0]["out_dir"] == s3_url  # the export row names the URL, not the staging folder
        ok = verify_at(f"{s3_url}/manifest.json", st)
        assert ok == {"ok": True, "problems": [], "export_id": remote["export_id"]}

        shard = next(f["path"] for f in remote["files"] if f["path"].endswith(".parquet"))
        saved = loc.get_bytes(shard)
        loc.put_bytes(shard, saved[:-10] + b"0123456789")  # a shard changed in the bucket
        problems = verify_at(f"{s3_url}/manifest.json", st)["problems"]
        assert f"{shard}: sha256 differs from the manifest" in problems[0]
        loc.delete(shard)
        assert f"{shard}: missing" in verify_at(f"{s3_url}/manifest.json", st)["problems"]
        with pytest.raises(ExportError, match="objects already exist under this prefix"):
            export_to(st, s3_url, cfg)
        with pytest.raises(ExportError, match="no manifest there"):
            verify_at(f"{s3_url}/nothing/manifest.json", st)


def test_a_server_gone_mid_export_upload_leaves_no_manifest(tmp_path, settings):
    from learner import ExportConfig, verify_at

    server = SeaweedFS(tmp_path / "weed", buckets=("shards",)).start()
    s3 = server.settings(home=settings.home)
    try:
        with open_store(f"sqlite:///{tmp_path / 's.sqlite'}", settings=s3) as st:
            from learner import export_to

            _seed_groups(st)
            with pytest.raises(ObjectStoreError, match=r"s3://shards/x/.* failed: .*reachable"):
                export_to(st, "s3://shards/x", ExportConfig(format="verl"), record=False,
                          uploaded=lambda name: server.stop())
            server.start()
            assert not open_location("s3://shards/x", s3).exists("manifest.json")
            with pytest.raises(Exception, match="no manifest there"):
                verify_at("s3://shards/x/manifest.json", st)
    finally:
        server.stop()


def test_cli_exports_to_s3_and_verifies_there(seaweedfs, s3_url, tmp_path):
    from tests.test_cli import run

    home = tmp_path / "home"
    with open_store(f"sqlite:///{home / 'store.sqlite'}") as st:
        _seed_groups(st)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"OPENFORGE_S3_ENDPOINT": seaweedfs.endpoint, "OPENFORGE_S3_ACCESS_KEY_ID": seaweedfs.access_key,
                     "OPENFORGE_S3_SECRET_ACCESS_KEY": seaweedfs.secret_key}.items():
            mp.setenv(k, v)
        out = run("export", "--format", "verl", "--out", s3_url, home=home).stdout
        assert f"-> {s3_url}" in out
        assert "verified" in run("export", "verify", f"{s3_url}/manifest.json", home=home).stdout
        missing = run("export", "verify", f"{s3_url}/none/manifest.json", home=home, check=False)
    assert missing.returncode == 2 and "no manifest there" in missing.stderr
