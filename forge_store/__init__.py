"""The lineage store: every part of OpenForge writes to it or reads from it through ``Store``."""

from .blobs import BlobStore, LocalBlobStore
from .errors import (
    BlobCorrupt,
    BlobNotFound,
    InvalidRecord,
    NotFound,
    SchemaMismatch,
    StoreError,
    StoreUnavailable,
    StoreURLError,
)
from .hashing import canonical_json, json_sha256, sha256_hex
from .journal import JournalCorrupt, JournalError, JournalLocked
from .records import (
    API_SURFACES,
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
from .settings import Settings, get_settings
from .store import Store, open_store

__all__ = [
    "API_SURFACES",
    "EXCLUSION_REASONS",
    "OUTCOMES",
    "REWARD_SOURCES",
    "BlobCorrupt",
    "BlobNotFound",
    "BlobStore",
    "CallRecord",
    "EventInfo",
    "InvalidRecord",
    "JournalCorrupt",
    "JournalError",
    "JournalLocked",
    "LocalBlobStore",
    "NotFound",
    "RewardInfo",
    "RolloutFilter",
    "RolloutInfo",
    "SchemaMismatch",
    "Settings",
    "Store",
    "StoreError",
    "StoreURLError",
    "StoreUnavailable",
    "StoredCall",
    "Trajectory",
    "canonical_json",
    "get_settings",
    "json_sha256",
    "open_store",
    "sha256_hex",
]
