"""The store's exceptions. Every message says the value, the rule and the fix."""


class StoreError(Exception):
    """Base of every error the store raises on purpose."""


class StoreURLError(StoreError, ValueError):
    """A store URL that cannot be used."""


class StoreUnavailable(StoreError):
    """The database could not be reached: when the store was opened, or for a read (``Store``'s reads raise this,
    never the database driver's errors)."""


class SchemaMismatch(StoreError):
    """The database is not at this code's migration head (empty, older, newer or foreign)."""


class BlobNotFound(StoreError, KeyError):
    """No blob with that sha256 in the blob store."""


class BlobCorrupt(StoreError):
    """A blob's bytes no longer hash to its address."""


class InvalidRecord(StoreError, ValueError):
    """A record that breaks a rule of the data model (unknown outcome, exclusion reason, ...)."""


class NotFound(StoreError, LookupError):
    """A read for an id that the store does not have."""
