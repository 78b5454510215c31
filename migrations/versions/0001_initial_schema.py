"""Initial schema: every noun of DESIGN.md's data model, the ingest counter and the store id.

Revision ID: 0001
Revises: 
Create Date: 2026-11-29 19:34:46.798704
"""
from alembic import op
import sqlalchemy as sa
import uuid

from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('blobs',
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('media_type', sa.String(length=128), nullable=True),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('sha256')
    )
    with op.batch_alter_table('blobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_blobs_ingest_seq'), ['ingest_seq'], unique=False)

    op.create_table('calls',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('rollout_id', sa.String(length=128), nullable=True),
    sa.Column('seq', sa.BigInteger(), nullable=False),
    sa.Column('api_surface', sa.String(length=32), nullable=False),
    sa.Column('model', sa.Text(), nullable=True),
    sa.Column('streamed', sa.Boolean(), nullable=False),
    sa.Column('request_hash', sa.String(length=64), nullable=False),
    sa.Column('system_prompt_hash', sa.String(length=64), nullable=True),
    sa.Column('tool_schema_hash', sa.String(length=64), nullable=True),
    sa.Column('request_params', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('prompt_base_call_id', sa.String(length=128), nullable=True),
    sa.Column('prompt_base_len', sa.Integer(), nullable=False),
    sa.Column('prompt_tail', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('n_prompt_messages', sa.Integer(), nullable=False),
    sa.Column('response', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('response_message_hash', sa.String(length=64), nullable=True),
    sa.Column('finish_reason', sa.String(length=32), nullable=True),
    sa.Column('prompt_ids_base_call_id', sa.String(length=128), nullable=True),
    sa.Column('prompt_ids_prefix_len', sa.Integer(), nullable=False),
    sa.Column('prompt_ids_tail', sa.LargeBinary(), nullable=True),
    sa.Column('n_prompt_tokens', sa.Integer(), nullable=True),
    sa.Column('completion_ids', sa.LargeBinary(), nullable=True),
    sa.Column('completion_logprobs', sa.LargeBinary(), nullable=True),
    sa.Column('n_completion_tokens', sa.Integer(), nullable=True),
    sa.Column('usage', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ttft_ms', sa.Float(), nullable=True),
    sa.Column('latency_ms', sa.Float(), nullable=True),
    sa.Column('upstream_status', sa.Integer(), nullable=True),
    sa.Column('error_class', sa.String(length=64), nullable=True),
    sa.Column('error_detail', sa.Text(), nullable=True),
    sa.Column('retry_of', sa.String(length=128), nullable=True),
    sa.Column('policy_version_id', sa.String(length=128), nullable=True),
    sa.Column('token_exact', sa.Boolean(), nullable=False),
    sa.Column('image_hashes', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('metadata', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('calls', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_calls_ingest_seq'), ['ingest_seq'], unique=False)
        batch_op.create_index(batch_op.f('ix_calls_policy_version_id'), ['policy_version_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_calls_request_hash'), ['request_hash'], unique=False)
        batch_op.create_index('ix_calls_rollout_seq', ['rollout_id', 'seq'], unique=False)

    op.create_table('events',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('rollout_id', sa.String(length=128), nullable=True),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.Column('time', sa.DateTime(timezone=True), nullable=False),
    sa.Column('detail', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_events_ingest_seq'), ['ingest_seq'], unique=False)
        batch_op.create_index(batch_op.f('ix_events_rollout_id'), ['rollout_id'], unique=False)

    op.create_table('exclusions',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('rollout_id', sa.String(length=128), nullable=True),
    sa.Column('call_id', sa.String(length=128), nullable=True),
    sa.Column('reason', sa.String(length=32), nullable=False),
    sa.Column('detail', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('export_id', sa.String(length=128), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('exclusions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_exclusions_export_id'), ['export_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_exclusions_ingest_seq'), ['ingest_seq'], unique=False)
        batch_op.create_index(batch_op.f('ix_exclusions_reason'), ['reason'], unique=False)
        batch_op.create_index(batch_op.f('ix_exclusions_rollout_id'), ['rollout_id'], unique=False)

    op.create_table('exports',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('format', sa.String(length=32), nullable=False),
    sa.Column('query', sa.Text(), nullable=True),
    sa.Column('watermark', sa.BigInteger(), nullable=False),
    sa.Column('out_dir', sa.Text(), nullable=True),
    sa.Column('manifest', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('counts', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('exports', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_exports_ingest_seq'), ['ingest_seq'], unique=False)

    op.create_table('harnesses',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('version', sa.String(length=128), nullable=True),
    sa.Column('config_hash', sa.String(length=64), nullable=True),
    sa.Column('config', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('harnesses', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_harnesses_ingest_seq'), ['ingest_seq'], unique=False)

    op.create_table('ingest_counter',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('value', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('messages',
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('role', sa.String(length=32), nullable=True),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('size', sa.Integer(), nullable=False),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('sha256')
    )
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_messages_ingest_seq'), ['ingest_seq'], unique=False)

    op.create_table('policy_versions',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('model_name', sa.Text(), nullable=False),
    sa.Column('checkpoint_id', sa.Text(), nullable=True),
    sa.Column('checkpoint_hash', sa.String(length=64), nullable=True),
    sa.Column('global_step', sa.BigInteger(), nullable=True),
    sa.Column('tokenizer_hash', sa.String(length=64), nullable=True),
    sa.Column('chat_template_hash', sa.String(length=64), nullable=True),
    sa.Column('engine', sa.String(length=64), nullable=True),
    sa.Column('engine_version', sa.String(length=64), nullable=True),
    sa.Column('sampling_defaults', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('metadata', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('policy_versions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_policy_versions_ingest_seq'), ['ingest_seq'], unique=False)

    op.create_table('rewards',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('rollout_id', sa.String(length=128), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.Column('source', sa.String(length=32), nullable=False),
    sa.Column('verifier_version', sa.String(length=128), nullable=True),
    sa.Column('evidence_blob', sa.String(length=64), nullable=True),
    sa.Column('detail', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('rewards', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rewards_ingest_seq'), ['ingest_seq'], unique=False)
        batch_op.create_index(batch_op.f('ix_rewards_rollout_id'), ['rollout_id'], unique=False)

    op.create_table('rollout_groups',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('run_id', sa.String(length=128), nullable=True),
    sa.Column('task_id', sa.String(length=128), nullable=False),
    sa.Column('policy_version_id', sa.String(length=128), nullable=True),
    sa.Column('target_size', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('rollout_groups', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rollout_groups_ingest_seq'), ['ingest_seq'], unique=False)
        batch_op.create_index(batch_op.f('ix_rollout_groups_policy_version_id'), ['policy_version_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_rollout_groups_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_rollout_groups_task_id'), ['task_id'], unique=False)

    op.create_table('rollouts',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('group_id', sa.String(length=128), nullable=True),
    sa.Column('run_id', sa.String(length=128), nullable=True),
    sa.Column('task_id', sa.String(length=128), nullable=True),
    sa.Column('harness_id', sa.String(length=128), nullable=True),
    sa.Column('policy_version_id', sa.String(length=128), nullable=True),
    sa.Column('backend', sa.String(length=64), nullable=True),
    sa.Column('image_ref', sa.Text(), nullable=True),
    sa.Column('image_digest', sa.String(length=128), nullable=True),
    sa.Column('pod_name', sa.Text(), nullable=True),
    sa.Column('node_name', sa.Text(), nullable=True),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('retry_of', sa.String(length=128), nullable=True),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('outcome', sa.String(length=32), nullable=True),
    sa.Column('outcome_detail', sa.Text(), nullable=True),
    sa.Column('metadata', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.Column('finished_seq', sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('rollouts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rollouts_finished_seq'), ['finished_seq'], unique=False)
        batch_op.create_index(batch_op.f('ix_rollouts_group_id'), ['group_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_rollouts_ingest_seq'), ['ingest_seq'], unique=False)
        batch_op.create_index(batch_op.f('ix_rollouts_outcome'), ['outcome'], unique=False)
        batch_op.create_index(batch_op.f('ix_rollouts_policy_version_id'), ['policy_version_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_rollouts_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_rollouts_task_id'), ['task_id'], unique=False)

    op.create_table('runs',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('name', sa.Text(), nullable=True),
    sa.Column('config', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_ingest_seq'), ['ingest_seq'], unique=False)

    op.create_table('store_meta',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('value', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    op.create_table('tasks',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('source', sa.Text(), nullable=True),
    sa.Column('domain', sa.String(length=128), nullable=True),
    sa.Column('instruction_hash', sa.String(length=64), nullable=True),
    sa.Column('verifier_hash', sa.String(length=64), nullable=True),
    sa.Column('environment_ref', sa.Text(), nullable=True),
    sa.Column('metadata', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tasks_domain'), ['domain'], unique=False)
        batch_op.create_index(batch_op.f('ix_tasks_ingest_seq'), ['ingest_seq'], unique=False)

    op.create_table('tool_schemas',
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('ingest_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('sha256')
    )
    with op.batch_alter_table('tool_schemas', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tool_schemas_ingest_seq'), ['ingest_seq'], unique=False)

    op.bulk_insert(sa.table("ingest_counter", sa.column("id", sa.Integer), sa.column("value", sa.BigInteger)),
                   [{"id": 1, "value": 0}])
    op.bulk_insert(sa.table("store_meta", sa.column("key", sa.String), sa.column("value", sa.Text)),
                   [{"key": "store_id", "value": str(uuid.uuid4())}])


def downgrade() -> None:
    with op.batch_alter_table('tool_schemas', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tool_schemas_ingest_seq'))

    op.drop_table('tool_schemas')
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tasks_ingest_seq'))
        batch_op.drop_index(batch_op.f('ix_tasks_domain'))

    op.drop_table('tasks')
    op.drop_table('store_meta')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_ingest_seq'))

    op.drop_table('runs')
    with op.batch_alter_table('rollouts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rollouts_task_id'))
        batch_op.drop_index(batch_op.f('ix_rollouts_run_id'))
        batch_op.drop_index(batch_op.f('ix_rollouts_policy_version_id'))
        batch_op.drop_index(batch_op.f('ix_rollouts_outcome'))
        batch_op.drop_index(batch_op.f('ix_rollouts_ingest_seq'))
        batch_op.drop_index(batch_op.f('ix_rollouts_group_id'))
        batch_op.drop_index(batch_op.f('ix_rollouts_finished_seq'))

    op.drop_table('rollouts')
    with op.batch_alter_table('rollout_groups', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rollout_groups_task_id'))
        batch_op.drop_index(batch_op.f('ix_rollout_groups_run_id'))
        batch_op.drop_index(batch_op.f('ix_rollout_groups_policy_version_id'))
        batch_op.drop_index(batch_op.f('ix_rollout_groups_ingest_seq'))

    op.drop_table('rollout_groups')
    with op.batch_alter_table('rewards', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rewards_rollout_id'))
        batch_op.drop_index(batch_op.f('ix_rewards_ingest_seq'))

    op.drop_table('rewards')
    with op.batch_alter_table('policy_versions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_policy_versions_ingest_seq'))

    op.drop_table('policy_versions')
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_messages_ingest_seq'))

    op.drop_table('messages')
    op.drop_table('ingest_counter')
    with op.batch_alter_table('harnesses', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_harnesses_ingest_seq'))

    op.drop_table('harnesses')
    with op.batch_alter_table('exports', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_exports_ingest_seq'))

    op.drop_table('exports')
    with op.batch_alter_table('exclusions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_exclusions_rollout_id'))
        batch_op.drop_index(batch_op.f('ix_exclusions_reason'))
        batch_op.drop_index(batch_op.f('ix_exclusions_ingest_seq'))
        batch_op.drop_index(batch_op.f('ix_exclusions_export_id'))

    op.drop_table('exclusions')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_events_rollout_id'))
        batch_op.drop_index(batch_op.f('ix_events_ingest_seq'))

    op.drop_table('events')
    with op.batch_alter_table('calls', schema=None) as batch_op:
        batch_op.drop_index('ix_calls_rollout_seq')
        batch_op.drop_index(batch_op.f('ix_calls_request_hash'))
        batch_op.drop_index(batch_op.f('ix_calls_policy_version_id'))
        batch_op.drop_index(batch_op.f('ix_calls_ingest_seq'))

    op.drop_table('calls')
    with op.batch_alter_table('blobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_blobs_ingest_seq'))

    op.drop_table('blobs')
