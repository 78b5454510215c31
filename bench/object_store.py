"""Object storage and the lake tier on a real S3-compatible server (SeaweedFS ``weed mini`` on loopback) next to a
local folder: blob puts and gets, a first lake snapshot of a store, and an incremental one after 10% more calls.

Prints, as its last line, one JSON object: per target (``local``, ``s3``) blob puts/s, re-puts/s (the idempotent
path), gets/s and MB/s, and the lake's full and incremental snapshot seconds with their row counts.

    python bench/object_store.py [--blobs 300] [--blob-kib 64] [--calls 3000]

Loopback only: this measures the client's and the server's cost, not a network.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forge_store import ObjectBlobStore, open_location, open_store  # noqa: E402
from forge_store._lake import lake_snapshot  # noqa: E402
from tests.doubles.seaweedfs import SeaweedFS  # noqa: E402
from tests.conftest import make_call  # noqa: E402


def _rate(n: int, f) -> float:
    t = time.perf_counter()
    for i in range(n):
        f(i)
    return n / (time.perf_counter() - t)


def bench_blobs(loc, blobs: list[bytes]) -> dict:
    store = ObjectBlobStore(loc)
    shas: list[str] = []
    put = _rate(len(blobs), lambda i: shas.append(store.put(blobs[i])))
    again = _rate(len(blobs), lambda i: store.put(blobs[i]))
    get = _rate(len(blobs), lambda i: store.get(shas[i]))
    mb = len(blobs[0]) / 1e6
    return {"puts_per_s": round(put, 1), "reputs_per_s": round(again, 1), "gets_per_s": round(get, 1),
            "put_mb_s": round(put * mb, 1), "get_mb_s": round(get * mb, 1)}


def bench_lake(st, target: str, settings, calls: int) -> dict:
    t = time.perf_counter()
    first = lake_snapshot(st.engine, target, settings=settings)
    full_s = time.perf_counter() - t
    more = calls // 10
    for i in range(calls, calls + more):
        st.record_call(make_call(f"c{i}", f"r{i // 20}", i % 20))
    st.flush(60)
    t = time.perf_counter()
    second = lake_snapshot(st.engine, target, settings=settings)
    inc_s = time.perf_counter() - t
    return {"full_s": round(full_s, 3), "full_rows": sum(x["rows"] for x in first["tables"].values()),
            "incremental_s": round(inc_s, 3), "incremental_rows": sum(x["rows"] for x in second["tables"].values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blobs", type=int, default=300)
    ap.add_argument("--blob-kib", type=int, default=64)
    ap.add_argument("--calls", type=int, default=3000)
    args = ap.parse_args()
    out: dict = {"blobs": args.blobs, "blob_kib": args.blob_kib, "calls": args.calls, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp, SeaweedFS(Path(tmp) / "weed", buckets=("bench",)) as server:
        settings = server.settings(home=Path(tmp) / "home", s3_max_retries=3, s3_timeout_s=60.0)
        blobs = [os.urandom(args.blob_kib << 10) for _ in range(args.blobs)]
        out["blob_local"] = bench_blobs(open_location(Path(tmp) / "blobs"), blobs)
        out["blob_s3"] = bench_blobs(open_location("s3://bench/blobs", settings), blobs)
        for name, target in (("lake_local", str(Path(tmp) / "lake")), ("lake_s3", "s3://bench/lake")):
            with open_store(f"sqlite:///{Path(tmp) / name}.sqlite", settings=settings) as st:
                for i in range(args.calls):
                    st.record_call(make_call(f"c{i}", f"r{i // 20}", i % 20))
                st.flush(120)
                out[name] = bench_lake(st, target, settings, args.calls)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
