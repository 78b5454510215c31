"""Erasure: tombstones, erased rollouts, an erasure's work list, and where snapshots and lakes were written.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 17:10:00
"""
from alembic import op
import sqlalchemy as sa

from sqlalchemy.dialects import postgresql

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')


def upgrade() -> None:
    op.create_table('tombstones',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('selection', _JSON, nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('actor', sa.String(length=128), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('counts', _JSON, nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('erased_rollouts',
    sa.Column('rollout_id', sa.String(length=128), nullable=False),
    sa.Column('tombstone_id', sa.String(length=64), nullable=False),
    sa.Column('group_id', sa.String(length=128), nullable=True),
    sa.Column('seen_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('rollout_id')
    )
    with op.batch_alter_table('erased_rollouts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_erased_rollouts_tombstone_id'), ['tombstone_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_erased_rollouts_seen_seq'), ['seen_seq'], unique=False)
    op.create_table('erasure_items',
    sa.Column('tombstone_id', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('key', sa.String(length=128), nullable=False),
    sa.PrimaryKeyConstraint('tombstone_id', 'kind', 'key')
    )
    op.create_table('store_copies',
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('url')
    )


def downgrade() -> None:
    op.drop_table('store_copies')
    op.drop_table('erasure_items')
    with op.batch_alter_table('erased_rollouts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_erased_rollouts_seen_seq'))
        batch_op.drop_index(batch_op.f('ix_erased_rollouts_tombstone_id'))
    op.drop_table('erased_rollouts')
    op.drop_table('tombstones')
