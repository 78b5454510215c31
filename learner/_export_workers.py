"""An export planned by several processes: each plans every N-th run of groups (reads, selection, reconstruction,
rows, Arrow tables) and the exporting process writes the shards, in run order, and records the exclusions.

Why processes: what an export spends is Python work per call (driver rows, token arrays, segments, rows) that
holds the GIL, so threads do not add a core; a process per core does. The workers are forked from the exporting
process after its :class:`~learner._plan.Planner` has read the store's index (which rollouts, which groups), so
they start in milliseconds and share that index; each opens its own database connections (SQLAlchemy's
``dispose(close=False)``) and never writes to the store: the exclusions it finds come back with its run and are
recorded by the parent in the order a single process records them. The shards are the same bytes: the rows of a
run come back as one table each, and the writer cuts row groups and shards at the same rows
(``ShardWriter.add_table``; tests/test_export_batched.py runs every configuration both ways).

Memory: a worker holds one run and sends it (a pipe's backpressure stops it one run ahead), the parent holds at
most a row group per shard set, so memory is bounded by the number of workers times a run.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from collections.abc import Callable

import pyarrow as pa

from forge_store import is_url

from . import _columns as columns
from ._plan import Planner, Tally
from ._export_notes import latest, note_lineage

# A store of this many finished rollouts and more is worth workers: below it they cost more than they save.
MIN_ROLLOUTS = 2_000


def default_workers(planner: Planner) -> int:
    """Workers for an export: one per core (at most 8) for a store of at least ``MIN_ROLLOUTS`` finished
    rollouts in two runs or more; 1 (no worker: the exporting process plans) otherwise, and where forking cannot
    be trusted: a blob store on an object-store client (its runtime's threads do not survive a fork), a SQLite
    database in memory (a worker could not see it), or a daemonic process (which may not start processes)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cores < 2 or planner.total < MIN_ROLLOUTS or not forkable(planner):
        return 1
    return min(cores, 8)


def forkable(planner: Planner) -> bool:
    """Whether the planner's store can be read from a forked worker."""
    store = planner.store
    url = store.engine.url
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        return False
    if multiprocessing.current_process().daemon:  # a daemonic process may not start processes
        return False
    return "fork" in multiprocessing.get_all_start_methods() and not is_url(store.blobs.location.url)


_INHERITED: list = []  # in a worker: the connection pool inherited from the parent, never closed, never used


class WorkerFailed(RuntimeError):
    """An export worker stopped with an error; the message holds its traceback."""


def _widen(conn) -> None:
    """The pipe's buffer at the system's most (Linux: ``/proc/sys/fs/pipe-max-size``, 1 MiB by default), where it
    can be: a run's tables are megabytes, and through the default 64 KiB the two processes take turns at every
    64 KiB (100 MB through a pipe: 0.33 CPU-s pickled at 64 KiB, 0.19 CPU-s with ``send_bytes`` at 1 MiB). Left as
    it is anywhere else."""
    try:
        import fcntl

        with open("/proc/sys/fs/pipe-max-size") as f:
            size = int(f.read())
        fcntl.fcntl(conn.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
    except (ImportError, OSError, ValueError):
        pass


def _recv_bytes(pipe, index: int) -> bytes:
    try:
        return pipe.recv_bytes()
    except EOFError:
        raise WorkerFailed(f"export worker ended while sending run {index} (killed, or out of memory?); run the "
                           "export again, or with --workers 1") from None


def _run_tables(planner: Planner, exporter, plans, schemas: dict[str, pa.Schema]) -> tuple[dict, dict, object, int]:
    """One run's rows as IPC-serialised tables of the storage schemas, its lineage, latest end and rollouts."""
    rows: dict[str, list[dict]] = {p: [] for p in schemas}
    lineage: dict[str, set] = {}
    data_time, exported = None, 0
    for plan in plans:
        for prefix, batch in exporter.rows(plan, planner).items():
            rows[prefix] += batch
            note_lineage(batch, planner, lineage)
        data_time = latest(data_time, plan)
        exported += len(plan.rollouts)
    tables = {}
    for prefix, batch in rows.items():
        if batch:
            sink = pa.BufferOutputStream()
            table = columns.shard_table(batch, schemas[prefix])
            with pa.ipc.new_stream(sink, table.schema) as w:
                w.write_table(table)
            tables[prefix] = sink.getvalue()  # a pyarrow Buffer: sent as it is (send_bytes), never pickled
    return tables, lineage, data_time, exported


def _work(planner: Planner, exporter, schemas: dict[str, pa.Schema], part: int, parts: int, conn) -> None:
    """A worker: plan runs ``part`` mod ``parts`` and send each as (index, its tables' prefixes, exclusions, tally,
    lineage, latest end, rollouts exported, rollouts planned), then each table's IPC bytes; ("error", exception,
    traceback) if anything fails."""
    try:
        # the parent's connections stay the parent's: the worker keeps their pool referenced, so nothing of it is
        # closed or collected here (os._exit at the end runs no finalizer), and opens connections of its own
        _INHERITED.append(planner.store.engine.pool)
        planner.store.engine.dispose(close=False)
        found: list = []
        planner.on_exclusion = found.append
        for index, plans in _tallied(planner, part, parts):
            exporter.n_prompts = 0  # a running index within the run; the parent renumbers
            tables, lineage, data_time, exported = _run_tables(planner, exporter, plans, schemas)
            prefixes = sorted(tables)
            conn.send((index, prefixes, list(found), _counts(planner.tally), lineage, data_time, exported,
                       sum(len(p.rollouts) for p in plans)))
            for prefix in prefixes:  # then each table's IPC bytes, unpickled
                conn.send_bytes(tables[prefix])
            found.clear()
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent, which raises
        try:
            conn.send(("error", exc, traceback.format_exc()))
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its traceback alone
            conn.send(("error", None, traceback.format_exc()))
    finally:
        conn.close()
        os._exit(0)  # no atexit handlers, no flush of the parent's buffers, no store close: this is a fork


def _tallied(planner: Planner, part: int, parts: int):
    """``planner.runs`` with a fresh tally for each run (the parent adds them up)."""
    planner.tally = Tally()
    for index, plans in planner.runs(part, parts):
        yield index, plans
        planner.tally = Tally()


def plan_in_workers(planner: Planner, exporter, writers: dict, lineage: dict[str, set], workers: int,
                    progress: Callable[[int, int], None] | None) -> tuple[dict[str, int], object, int]:
    """What ``_write_rows`` returns, with ``workers`` processes planning: rows per prefix, latest end, rollouts
    exported. Exclusions go to the planner's ``on_exclusion`` in run order; its tally gets each run's counts."""
    ctx = multiprocessing.get_context("fork")
    schemas = {p: w.storage for p, w in writers.items()}
    procs, pipes = [], []
    try:
        for k in range(workers):
            recv, send = ctx.Pipe(duplex=False)
            _widen(send)
            proc = ctx.Process(target=_work, args=(planner, exporter, schemas, k, workers, send), daemon=True,
                               name=f"openforge-export-{k}")
            proc.start()
            send.close()
            procs.append(proc)
            pipes.append(recv)
        return _collect(planner, exporter, writers, lineage, pipes, progress)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()


def _collect(planner: Planner, exporter, writers: dict, lineage: dict[str, set], pipes: list,
             progress: Callable[[int, int], None] | None) -> tuple[dict[str, int], object, int]:
    rows = {p: 0 for p in writers}
    done, data_time, exported_rollouts = 0, None, 0
    for index in range(planner.n_runs()):
        try:
            msg = pipes[index % len(pipes)].recv()
        except EOFError:
            raise WorkerFailed(f"export worker {index % len(pipes)} ended without sending run {index} (killed, or "
                               "out of memory?); run the export again, or with --workers 1") from None
        if msg[0] == "error":
            failed = WorkerFailed(f"export worker {index % len(pipes)} failed on run {index}:\n{msg[2]}")
            if isinstance(msg[1], Exception):  # the worker's own error (an ExportError says what to fix)
                raise msg[1] from failed
            raise failed
        got, prefixes, found, tally, seen, end, exported, planned = msg
        assert got == index, f"export worker sent run {got}, expected {index}"
        tables = {prefix: _recv_bytes(pipes[index % len(pipes)], index) for prefix in prefixes}
        for e in found:  # counted in the run's tally, recorded here
            planner.on_exclusion(e)
        _add_tally(planner.tally, tally)
        for prefix, raw in sorted(tables.items()):
            table = pa.ipc.open_stream(raw).read_all()
            table = renumber(exporter, prefix, table, rows[prefix])
            writers[prefix].add_table(table)
            rows[prefix] += table.num_rows
        for key, values in seen.items():
            lineage.setdefault(key, set()).update(values)
        if end is not None and (data_time is None or end > data_time):
            data_time = end
        exported_rollouts += exported
        done += planned
        if progress:
            progress(done, planner.total)
    return rows, data_time, exported_rollouts


_RUN_COUNTS = ("calls", "merged", "groups", "singleton_groups", "all_equal_groups")


def _counts(tally: Tally) -> dict:
    """What a run adds to the export's tally (the rollouts seen are the parent's own count)."""
    return {**{key: getattr(tally, key) for key in _RUN_COUNTS}, "exclusions": dict(tally.exclusions)}


def _add_tally(total: Tally, run: dict) -> None:
    for key in _RUN_COUNTS:
        setattr(total, key, getattr(total, key) + run[key])
    for reason, n in run["exclusions"].items():
        total.exclusions[reason] += n


def renumber(exporter, prefix: str, table: pa.Table, offset: int) -> pa.Table:
    """A run's table with the exporter's running row index (numbered from 0 in the run) moved on by ``offset``:
    the rows before it in the export."""
    field = getattr(exporter, "running_index", {}).get(prefix)
    if field is None or not offset:
        return table
    column, child = field
    col = table.column(column).combine_chunks()
    t = col.type
    # a few rows a run: moved on in Python (pyarrow.compute with a Python int imports pandas, 0.4-0.9 s)
    children = [columns.column([None if v is None else v + offset for v in col.field(i).to_pylist()], t.field(i).type)
                if t.field(i).name == child else col.field(i) for i in range(t.num_fields)]
    new = pa.StructArray.from_arrays(children, fields=list(t), mask=col.is_null() if col.null_count else None)
    return table.set_column(table.schema.get_field_index(column), table.schema.field(column), new)
