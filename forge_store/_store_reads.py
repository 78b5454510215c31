"""``StoreReads``: the read half of ``Store``'s API (``Store`` inherits it), over :mod:`forge_store._reads`."""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as sa

from . import _group_reads as group_reads
from . import _reads as reads
from . import _replica_reads as replica_reads
from . import _schema as schema
from ._blobs import BlobStore
from ._call_summaries import CallSummary, call_summaries
from ._errors import StoreUnavailable
from ._images import restore_images
from ._records import EventInfo, RewardInfo, RolloutFilter, RolloutInfo, StoredCall, Trajectory
from ._rewards import check_sources
from ._search import SearchHit, search
from ._stats import Stats
from ._timeline import TimelineCall, timeline
from ._token_calls import TokenCall, token_calls


class StoreReads:
    """The read half of ``Store``, which inherits it (it needs only ``self.engine`` and ``self.blobs``).

    Per-rollout reads for one trajectory; batched reads (``calls_by_rollout``, ``latest_rewards``,
    ``call_summaries``, ``exclusion_reasons``) for clients that walk many rollouts, one query per chunk of them;
    ``stats`` for the dashboards' windowed aggregates. Every read that takes ``as_of`` sees the store as of that
    watermark. Clients read through these, never with SQL of their own (analysts: ``connect_duckdb``)."""

    engine: sa.Engine
    blobs: BlobStore
    url: str

    @contextmanager
    def _reading(self) -> Iterator[sa.Connection]:
        """A connection for one read. A database that refuses, breaks or has no connection to spare is
        ``StoreUnavailable``: clients catch the store's errors, never its driver's."""
        try:
            with self.engine.connect() as conn:
                yield conn
        except (sa.exc.DBAPIError, sa.exc.TimeoutError) as exc:
            orig = getattr(exc, "orig", None)
            reason = (str(orig).strip().splitlines() or [""])[0] if orig is not None else exc.__class__.__name__
            raise StoreUnavailable(f"the store at {self.url} cannot be read now ({reason}); check that its database "
                                   "is running and reachable, then retry") from exc

    def get_blob(self, sha256: str) -> bytes:
        return self.blobs.get(sha256)

    def watermark(self) -> int:
        """The highest ingest sequence number committed: every row at or below it is visible, forever."""
        with self._reading() as conn:
            return conn.execute(sa.select(schema.IngestCounter.value).where(schema.IngestCounter.id == 1)).scalar_one()

    def rollout(self, rollout_id: str, *, as_of: int | None = None) -> RolloutInfo:
        with self._reading() as conn:
            return reads.rollout(conn, rollout_id, as_of)

    def iter_rollouts(self, flt: RolloutFilter | None = None, *, as_of: int | None = None) -> Iterator[RolloutInfo]:
        with self._reading() as conn:
            yield from reads.iter_rollouts(conn, flt, as_of)

    def group_index(self, *, as_of: int | None = None) -> Iterator[tuple[str | None, str | None, int, int]]:
        """(group id, rollout id, finished, rollouts) as of the watermark: a row per group (rollout id None) and
        a row per rollout without a group (group id None), with how many of its rollouts had finished and how
        many there were; for readers that walk a whole store group by group and read the records run by run
        (``group_rollouts``, ``rollouts``) without holding a row per rollout."""
        with self._reading() as conn:
            yield from group_reads.group_index(conn, as_of)

    def group_rollouts(self, group_ids: Sequence[str], *, as_of: int | None = None) -> dict[str, list[RolloutInfo]]:
        """Group id -> its rollouts (as ``rollout`` reads them), in id order, for many groups at once."""
        with self._reading() as conn:
            return group_reads.group_rollouts(conn, group_ids, as_of)

    def calls(self, rollout_id: str, *, as_of: int | None = None, damage: dict | None = None) -> list[StoredCall]:
        """A rollout's calls in order, prompts and token ids resolved. A call the store cannot give back (the
        database refused it; or its stored delta lost its base) is left out, the rest are returned: ``damage``
        (a dict) receives rollout id -> ``[{"call_id", "seq", "why"}]``; without it the damage is logged."""
        with self._reading() as conn:
            return reads.calls(conn, rollout_id, as_of, damage)

    def calls_by_rollout(self, rollout_ids: Sequence[str], *, as_of: int | None = None,
                         damage: dict | None = None) -> dict[str, list[StoredCall]]:
        """``calls`` of many rollouts at once (rollout id -> its calls in order; [] for a rollout without calls);
        ``damage`` as for ``calls``."""
        with self._reading() as conn:
            return reads.calls_by_rollout(conn, rollout_ids, as_of, damage=damage)

    def token_calls(self, rollout_ids: Sequence[str], *, as_of: int | None = None,
                    damage: dict | None = None) -> dict[str, list[TokenCall]]:
        """The calls of many rollouts as a token-level export reads them (:class:`TokenCall`: token arrays as raw
        bytes, no prompt messages but those of each rollout's first call): one query per 500 rollouts, the same
        calls in the same order as ``calls_by_rollout``, and the same ``damage``."""
        with self._reading() as conn:
            return token_calls(conn, rollout_ids, as_of, damage=damage)

    def rollouts(self, rollout_ids: Sequence[str], *, as_of: int | None = None) -> dict[str, RolloutInfo]:
        """Rollout id -> ``rollout(id, as_of=...)`` for many ids at once; ids not in the store are left out."""
        with self._reading() as conn:
            return reads.rollouts_by_id(conn, rollout_ids, as_of)

    def call(self, call_id: str) -> StoredCall:
        with self._reading() as conn:
            return reads.call(conn, call_id)

    def find_call(self, rollout_id: str, key: str, value: str) -> StoredCall:
        """The call of ``rollout_id`` whose metadata holds ``key: value`` (a client's own handle on a call, such as
        the proxy's Responses id), its prompt resolved; ``NotFound`` if none is in the database (yet). One indexed
        read of the rollout's call rows, then the one call's prompt."""
        with self._reading() as conn:
            return replica_reads.find_call(conn, rollout_id, key, value)

    def ended_rollouts(self, rollout_ids: Sequence[str], event_kind: str | None = None) -> set[str]:
        """Which of ``rollout_ids`` have finished, or (with ``event_kind``) have an event of that kind: one query
        per 500 of them (a proxy replica asks which of the rollouts it serves another replica ended)."""
        with self._reading() as conn:
            return replica_reads.ended_rollouts(conn, rollout_ids, event_kind)

    def restore_images(self, messages: list) -> list:
        """``messages`` as read back (images as blob references) with the images put back inline, as the client
        sent them (a copy)."""
        return restore_images(messages, self.blobs.get)

    def call_summaries(self, rollout_ids: Sequence[str]) -> dict[str, list[CallSummary]]:
        """Light views of many rollouts' calls for behaviour analysis (:class:`CallSummary`), in order."""
        with self._reading() as conn:
            return call_summaries(conn, rollout_ids)

    def rewards(self, rollout_id: str, *, as_of: int | None = None) -> list[RewardInfo]:
        """Every reward row of a rollout, in ingest order (superseded ones too)."""
        with self._reading() as conn:
            return reads.rewards(conn, rollout_id, as_of)

    def latest_rewards(self, rollout_ids: Sequence[str], *, sources: Collection[str] | None = None,
                       as_of: int | None = None) -> dict[str, RewardInfo]:
        """Rollout id -> the reward that counts: its latest from ``sources`` (None: any source; see
        :mod:`forge_store._rewards`). Rollouts without such a reward are left out."""
        sources = check_sources(sources)
        with self._reading() as conn:
            return reads.latest_rewards(conn, rollout_ids, sources, as_of)

    def exclusion_reasons(self, rollout_ids: Sequence[str] | None = None) -> dict[str, set[str]]:
        """Rollout id -> why it was excluded from training data (by any export); None reads every rollout."""
        with self._reading() as conn:
            return reads.exclusion_reasons(conn, rollout_ids)

    def events(self, rollout_id: str, *, as_of: int | None = None) -> list[EventInfo]:
        with self._reading() as conn:
            return reads.events(conn, rollout_id, as_of)

    def lineage(self, kind: str, *, as_of: int | None = None, ids: Sequence[str] | None = None) -> list[dict]:
        """All rows of ``tasks``, ``harnesses``, ``policy_versions`` or ``rollout_groups`` (in ingest order); with
        ``ids``, only the rows of those ids (one query however many: an export reads a run's groups so)."""
        with self._reading() as conn:
            return reads.lineage(conn, kind, as_of, ids)

    def trajectory(self, rollout_id: str, *, as_of: int | None = None) -> Trajectory:
        with self._reading() as conn:
            return Trajectory(
                rollout=reads.rollout(conn, rollout_id, as_of),
                calls=reads.calls(conn, rollout_id, as_of),
                rewards=reads.rewards(conn, rollout_id, as_of),
                events=reads.events(conn, rollout_id, as_of),
            )

    def counts(self) -> dict[str, int]:
        """Row count of every table."""
        with self._reading() as conn:
            return {t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                    for t in schema.Base.metadata.sorted_tables}

    def timeline(self, rollout_id: str) -> list[TimelineCall]:
        """One rollout's calls in order, light: what each adds to its prompt, its answer, timings, error and whether
        it extends the previous call (see :mod:`forge_store._timeline`). For long rollouts, where ``calls`` is
        O(turns^2)."""
        with self._reading() as conn:
            return timeline(conn, rollout_id)

    def search(self, query: str, *, limit: int = 50, **filters) -> tuple[list[SearchHit], bool]:
        """Calls whose text (new prompt messages, answer, tool calls and results, error) holds ``query``, a literal
        substring of three characters or more, any case; newest first, at most ``limit``, and whether there are more.
        ``filters``: ``task_id``, ``policy_version_id``, ``harness_id``, ``outcome``, ``purpose``, ``since``,
        ``until`` (the rollout's start). See :mod:`forge_store._search`."""
        with self._reading() as conn:
            return search(conn, query, limit=limit, **filters)

    @functools.cached_property
    def stats(self) -> Stats:
        """The dashboards' windowed aggregates (:class:`forge_store._stats.Stats`)."""
        return Stats(self.engine)
