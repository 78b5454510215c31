"""The lineage store: every part of OpenForge writes to it or reads from it through ``Store``."""

from ._backoff import Backoff
from ._blobs import BlobStore, LocalBlobStore, ObjectBlobStore, open_blob_store
from ._call_draft import CallDraft
from ._call_summaries import CallSummary
from ._erase import ErasureReport, erase
from ._erase import resume as resume_erasures
from ._erase_copies import EraseError
from ._erase_select import Selection
from ._errors import (
    BlobCorrupt,
    BlobNotFound,
    InvalidRecord,
    NotFound,
    SchemaMismatch,
    StoreError,
    StoreUnavailable,
    StoreURLError,
)
from ._hashing import canonical_json, json_sha256, sha256_hex
from ._objstore import Location, ObjectNotFound, ObjectStoreError, is_url, open_location
from ._records import (
    EXCLUSION_REASONS,
    OUTCOMES,
    REWARD_SOURCES,
    CallRecord,
    EventInfo,
    RewardInfo,
    RolloutFilter,
    RolloutInfo,
    StoredCall,
    Trajectory,
)
from ._rescores import RescoreRow, record_rescores, rescored_call_ids, rescores
from ._rewards import latest_reward
from ._search import SearchHit
from ._settings import Settings, get_settings
from ._stats import Stats, Window
from ._timeline import TimelineCall
from ._store import Store, open_store
from ._token_calls import TokenCall
from ._tokens import IdsText
from ._tombstones import TombstoneInfo, erased_rollouts, tombstones
from ._write.call_encoder import FINISH_REASON_MAX
from ._write.journal_files import JournalCorrupt, JournalError, JournalLocked


def __getattr__(name: str):
    # DuckDB loads on first use: most clients of the store never touch it.
    if name in ("connect_duckdb", "ANALYSIS_VIEWS"):
        from . import _duckdb_views

        return _duckdb_views.connect if name == "connect_duckdb" else _duckdb_views.ANALYSIS_VIEWS
    if name == "print_table":  # rich loads when a command prints a table
        from ._tables import print_table

        return print_table
    raise AttributeError(f"module 'forge_store' has no attribute {name!r}")


__all__ = [
    "tombstones",
    "resume_erasures",
    "erased_rollouts",
    "erase",
    "TombstoneInfo",
    "Selection",
    "ErasureReport",
    "EraseError",
    "ANALYSIS_VIEWS",
    "EXCLUSION_REASONS",
    "FINISH_REASON_MAX",
    "OUTCOMES",
    "REWARD_SOURCES",
    "Backoff",
    "BlobCorrupt",
    "BlobNotFound",
    "BlobStore",
    "CallDraft",
    "CallRecord",
    "CallSummary",
    "EventInfo",
    "IdsText",
    "InvalidRecord",
    "JournalCorrupt",
    "JournalError",
    "JournalLocked",
    "LocalBlobStore",
    "Location",
    "NotFound",
    "ObjectBlobStore",
    "ObjectNotFound",
    "ObjectStoreError",
    "RewardInfo",
    "RolloutFilter",
    "RescoreRow",
    "RolloutInfo",
    "SchemaMismatch",
    "SearchHit",
    "Settings",
    "Stats",
    "Store",
    "StoreError",
    "StoreURLError",
    "StoreUnavailable",
    "StoredCall",
    "TimelineCall",
    "TokenCall",
    "Trajectory",
    "Window",
    "canonical_json",
    "connect_duckdb",
    "get_settings",
    "json_sha256",
    "is_url",
    "latest_reward",
    "open_blob_store",
    "open_location",
    "open_store",
    "print_table",
    "record_rescores",
    "rescored_call_ids",
    "rescores",
    "sha256_hex",
]
