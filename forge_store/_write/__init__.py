"""The store's write path, one module per step; a write is durable before its caller hears back.

``Store.record_call`` -> ``call_encoder`` (a call -> an operation: message and tool bodies by hash, prompt token ids
as a delta against the rollout's previous call; ``prompt_cache`` keeps each rollout's last prompt, so that only new
messages are prepared and hashed) -> ``op_codec`` (an operation <-> journal bytes) -> ``journal``
(``Journal`` appends, with group-commit fsync, in the format of ``journal_files``) -> the submitter is answered.
Then a database side applies what is journaled, by one of two writers that share ``journaling_writer``:
``thread_writer`` (a thread of this process) or ``process_writer`` (a child process, ``drain_process``, which reads
the journal with ``journal_tail``). Both apply through ``db_apply``: one transaction per batch, idempotent by id.

Recovery: the journal's next owner cuts a torn tail off (``journal_files.repair_torn_tail``) and replays every
record after the checkpoint (``ThreadWriter`` from the files; the drain process from ``JournalTail``'s cursor);
``openforge store drain`` does the same for every journal whose writer is gone. A store opened while its database
was away (``open_store(..., offline=True)``) checks the schema before its first batch (``db_ready``). Dead letters:
an operation the database refuses for good is kept in the journal's ``dead-letter/`` folder by
``db_apply.BatchApplier``.
"""
