"""Alembic environment: one migration chain for SQLite and PostgreSQL.

Run through ``openforge db upgrade`` (see forge_store/_migrate.py), which hands a live connection in
``config.attributes["connection"]`` and the store's table metadata in ``config.attributes["target_metadata"]``
(so this package imports nothing of the store). SQLite gets batch mode so that ALTERs in later migrations work there too.
"""

from alembic import context

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `openforge db upgrade` (forge_store._migrate), not bare alembic")

context.configure(
    connection=connection,
    target_metadata=config.attributes.get("target_metadata"),
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
    include_name=config.attributes.get("include_name"),  # objects the models leave out (the search index)
)
with context.begin_transaction():
    context.run_migrations()
