"""Re-scores: a stored call's completion logprobs under a policy version, by a scorer (append-only).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 12:45:00
"""
from alembic import op
import sqlalchemy as sa

from sqlalchemy.dialects import postgresql

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')


def upgrade() -> None:
    op.create_table('rescores',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('call_id', sa.String(length=128), nullable=False),
    sa.Column('rollout_id', sa.String(length=128), nullable=True),
    sa.Column('policy_version_id', sa.String(length=128), nullable=False),
    sa.Column('scorer', sa.String(length=64), nullable=False),
    sa.Column('scorer_lineage', _JSON, nullable=True),
    sa.Column('n_tokens', sa.Integer(), nullable=False),
    sa.Column('logprobs', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('rescores', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rescores_call_id'), ['call_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_rescores_rollout_id'), ['rollout_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_rescores_ingest_seq'), ['ingest_seq'], unique=False)
        batch_op.create_index('ix_rescores_version_scorer', ['policy_version_id', 'scorer'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('rescores', schema=None) as batch_op:
        batch_op.drop_index('ix_rescores_version_scorer')
        batch_op.drop_index(batch_op.f('ix_rescores_ingest_seq'))
        batch_op.drop_index(batch_op.f('ix_rescores_rollout_id'))
        batch_op.drop_index(batch_op.f('ix_rescores_call_id'))
    op.drop_table('rescores')
