"""The catalog of planted durability bugs that the stress suite must catch.

Each :class:`Mutant` names one realistic mistake and says how to plant it: in
``file`` (relative to the ``substrat`` package), the ``old`` snippet, which
must occur exactly once, becomes ``new``. The runner (:mod:`oracle.mutants`)
plants each one in a temporary copy of the package, never in the working tree,
and runs the stress suite against it. A mutant the suite does not kill is a
bug class the toolkit is blind to.

Snippets are exact text, indentation included, so a refactor that moves the
code a mutant targets makes that mutant fail loudly ("snippet not found")
instead of silently testing nothing; update the snippet with the refactor.
"""

from __future__ import annotations

from oracle.mutant_def import Mutant as Mutant
from oracle.mutant_edges import EDGES
from oracle.mutant_eio import EIO_IN_MEMORY

CATALOG: tuple[Mutant, ...] = (
    # -- persistence.py: the durable primitives -------------------------------
    Mutant(
        "log_append_no_fsync",
        "EventLog.log acknowledges an append that was never fsynced",
        "eventlog.py",
        "            persistence.write_all(self._fd, line)\n"
        "            persistence.fsync_fd(self._fd, self.path)\n",
        "            persistence.write_all(self._fd, line)\n",
    ),
    Mutant(
        "atomic_write_no_file_fsync",
        "atomic_write renames the temp file over the target without fsyncing its data",
        "persistence.py",
        "        write_all(fd, data)\n        fsync_fd(fd, tmp)\n",
        "        write_all(fd, data)\n",
    ),
    Mutant(
        "atomic_write_no_dir_fsync",
        "atomic_write never fsyncs the directory after the rename",
        "persistence.py",
        "    os.replace(tmp, target)\n    fsync_dir(_parent(target))\n",
        "    os.replace(tmp, target)\n",
    ),
    Mutant(
        "create_no_dir_fsync",
        "durable_create never fsyncs the directory that holds the new entry",
        "persistence.py",
        "_FILE_MODE))\n    fsync_dir(_parent(path))\n",
        "_FILE_MODE))\n",
    ),
    Mutant(
        "mkdir_no_dir_fsync",
        "durable_mkdir creates directories without fsyncing their parents",
        "persistence.py",
        "                raise\n        fsync_dir(_dirname(level))\n    return bool(missing)\n",
        "                raise\n    return bool(missing)\n",
    ),
    Mutant(
        "unlink_no_dir_fsync",
        "durable_unlink removes the file without fsyncing its directory",
        "persistence.py",
        "        return False\n    fsync_dir(_parent(path))\n    return True\n",
        "        return False\n    return True\n",
    ),
    Mutant(
        "mkdir_existing_not_fsynced",
        "durable_mkdir of a directory that is already visible returns without fsyncing its "
        "parent, so a retry after a failed fsync acknowledges an entry that is not durable",
        "persistence.py",
        "    _make_ancestors_durable(probe, base, found)\n",
        "    pass  # planted: trust what the page cache shows\n",
    ),
    Mutant(
        "mkdir_trusts_visible_ancestors",
        "durable_mkdir fsyncs the parent of an existing target but trusts every visible "
        "ancestor, so a directory below one left by a failed call is acknowledged but lost",
        "persistence.py",
        "    _make_ancestors_durable(probe, base, found)\n",
        "    if not missing:\n        fsync_dir(_dirname(probe))  # planted: the target alone\n",
    ),
    Mutant(
        "unlink_missing_not_fsynced",
        "durable_unlink of a file that is already gone returns without fsyncing the "
        "directory, so a retry after a failed fsync acknowledges a removal that is not durable",
        "persistence.py",
        "        if os.path.isdir(_parent(path)):\n            fsync_dir(_parent(path))\n"
        "        return False\n",
        "        return False\n",
    ),
    Mutant(
        "rename_no_dst_dir_fsync",
        "durable_rename never fsyncs the destination directory",
        "persistence.py",
        "    os.replace(src, dst)\n    fsync_dir(_parent(dst))\n",
        "    os.replace(src, dst)\n",
    ),
    Mutant(
        "rename_no_src_dir_fsync",
        "durable_rename across directories never fsyncs the source directory",
        "persistence.py",
        "    if Path(_parent(src)) != Path(_parent(dst)):  # the same directory however spelt\n"
        "        fsync_dir(_parent(src))\n",
        "",
    ),
    Mutant(
        "fsync_retry_after_eio",
        "a failed fsync is retried, and the retry's success is taken as durability",
        "persistence.py",
        "        os.fsync(fd)\n    except OSError as exc:\n",
        "        os.fsync(fd)\n    except OSError as exc:\n"
        "        os.fsync(fd)  # planted: retry, as if the kernel still had the pages\n"
        "        return\n",
    ),
    Mutant(
        "fsync_error_ignored",
        "a failed fsync is ignored (no error reaches the caller, who acknowledges)",
        "persistence.py",
        '    except OSError as exc:\n        raise DurabilityError(\n            f"fsync of {what}',
        "    except OSError as exc:\n        return  # planted: the error goes nowhere\n"
        '        raise DurabilityError(\n            f"fsync of {what}',
    ),
    # -- eventlog.py: repair on open, failed appends --------------------------------
    Mutant(
        "no_torn_tail_repair",
        "opening a log does not cut a torn tail, so the next append is glued onto it",
        "eventlog.py",
        "            if size > scan.valid_end:\n",
        "            if False:  # planted: no torn-tail repair\n",
    ),
    Mutant(
        "no_pending_replay",
        "opening a log ignores a durable pending entry that the log lacks",
        "eventlog.py",
        "            replay = None if none_pending else self._pending_to_replay(scan.seqs, floor, report)\n",  # noqa: E501
        "            replay = None  # planted: no pending replay\n",
    ),
    Mutant(
        "pending_dedup_tail_only",
        "a pending entry counts as logged only if it is the last entry (tail dedup)",
        "eventlog.py",
        '        if decoded["seq"] in seqs or decoded["seq"] <= floor:\n',
        '        if decoded["seq"] == report.last_seq:\n',
    ),
    Mutant(
        "failed_append_not_taken_back",
        "after a failed append the log keeps the entry (the page cache, or the disk when "
        "writeback raced the error, still has it) yet reports it as failed, so a reopen "
        "trusts bytes that never reach the disk, or a crash brings a failed entry back",
        "eventlog.py",
        "            taken_back = self._take_back()\n",
        "            taken_back = True  # planted: the failed append stays where it is\n",
    ),
    Mutant(
        "log_seq_restarts_on_reopen",
        "a reopened log numbers its entries from 1 again instead of after the last one",
        "eventlog.py",
        "        self._next_seq = self.report.last_seq + 1\n",
        "        self._next_seq = 1  # planted: the counter is not restored from the log\n",
    ),
    Mutant(
        "checkpoint_before_entry_durable",
        "an append is counted (and may be checkpointed) after its write but before its "
        "fsync, so a checkpoint can cover an entry a crash then loses",
        "eventlog.py",
        "            persistence.write_all(self._fd, line)\n"
        "            persistence.fsync_fd(self._fd, self.path)\n"
        "            _check_linked(self._fd, self.path)\n"
        "        except OSError as exc:\n"
        "            # A simulated kill (BaseException) is deliberately not caught here:\n"
        "            # a killed process runs no cleanup.\n"
        "            taken_back = self._take_back()\n"
        "            self._poison()\n"
        "            if not taken_back:\n"
        "                raise OutcomeUnknownError(\n"
        '                    f"append of entry {seq} to {self.path} failed ({exc}) and could not be "\n'  # noqa: E501
        '                    "taken back: a crash may keep it or not; treat it as undecided until "\n'  # noqa: E501
        '                    "a restart has recovered the log"\n'
        "                ) from exc\n"
        '            # what the host needs first: "reopen the log" is for this object\'s caller\n'
        "            taken = (\n"
        '                f"append of entry {seq} to {self.path} failed ({exc}) and was taken back: "\n'  # noqa: E501
        '                "it will not appear (reopen the log before writing again)"\n'
        "            )\n"
        "            raise DurabilityError(with_advice(taken, exc, first=True)) from exc\n"
        "        self._appended(line)\n"
        "        return seq\n",
        "            persistence.write_all(self._fd, line)\n"
        "            self._appended(line)  # planted: counted before its fsync\n"
        "            persistence.fsync_fd(self._fd, self.path)\n"
        "            _check_linked(self._fd, self.path)\n"
        "        except OSError as exc:\n"
        "            # A simulated kill (BaseException) is deliberately not caught here:\n"
        "            # a killed process runs no cleanup.\n"
        "            taken_back = self._take_back()\n"
        "            self._poison()\n"
        "            if not taken_back:\n"
        "                raise OutcomeUnknownError(\n"
        '                    f"append of entry {seq} to {self.path} failed ({exc}) and could not be "\n'  # noqa: E501
        '                    "taken back: a crash may keep it or not; treat it as undecided until "\n'  # noqa: E501
        '                    "a restart has recovered the log"\n'
        "                ) from exc\n"
        '            # what the host needs first: "reopen the log" is for this object\'s caller\n'
        "            taken = (\n"
        '                f"append of entry {seq} to {self.path} failed ({exc}) and was taken back: "\n'  # noqa: E501
        '                "it will not appear (reopen the log before writing again)"\n'
        "            )\n"
        "            raise DurabilityError(with_advice(taken, exc, first=True)) from exc\n"
        "        return seq\n",
    ),
    Mutant(
        "session_write_in_place",
        "session.json is rewritten in place (truncate, write, fsync) instead of atomically",
        "session/store.py",
        "        persistence.atomic_write(record, session.to_record())\n",
        '        with open(record, "wb") as handle:\n'
        "            handle.write(session.to_record())\n"
        "            handle.flush()\n"
        "            os.fsync(handle.fileno())\n",
    ),
    Mutant(
        "session_save_trusts_visible_dir",
        "SessionStore.save skips durable_mkdir when the session directory is visible, so a "
        "save retried after a failed one writes into a directory that is not durable",
        "session/store.py",
        "        if session_id not in self._written and not os.path.exists(record):\n",
        "        if session_id not in self._written and not os.path.isdir(\n"
        "            self.session_dir(session_id)\n"
        "        ):\n",
    ),
    Mutant(
        "active_left_active",
        "recovery leaves records ACTIVE although no provider session survived the crash",
        "session/store.py",
        "            if session.state is SessionState.ACTIVE:\n",
        "            if False:  # planted: ACTIVE records are not suspended\n",
    ),
    Mutant(
        "terminated_marker_before_record",
        "a termination leaves its marker before its TERMINATED record is durable, so a crash"
        " in between leaves a marker that a restart trusts on a live record",
        "session/store.py",
        "        session.transition(target)\n        try:\n            self.save(session)\n",
        "        session.transition(target)\n"
        "        if target is SessionState.TERMINATED:  # planted: the marker first\n"
        "            self._mark_terminated(session.session_id)\n"
        "        try:\n            self.save(session)\n",
    ),
    Mutant(
        "terminated_marker_on_any_transition",
        "every state change leaves a terminated marker, so a restart skips live records",
        "session/store.py",
        "        if target is SessionState.TERMINATED:\n            self._mark_terminated(",
        "        if True:  # planted: a marker whatever the state\n"
        "            self._mark_terminated(",
    ),
    Mutant(
        "marked_sessions_forgotten",
        "recovery forgets the sessions whose marker says terminated (their records are not"
        " read), so a parent terminated before the crash no longer counts as dead",
        "recovery.py",
        "    for sid in scan.terminated:\n",
        "    for sid in ():  # planted: the marked sessions are not in the records\n",
    ),
    # -- orchestrator: order of logging and acknowledging ------------------------------
    Mutant(
        "create_root_acks_before_logging",
        "create_root returns (acknowledges) before agent.created is logged",
        "orchestrator.py",
        "            self._log_creation(node, parent_session_id=None, fresh=fresh)\n",
        '            __import__("asyncio").get_running_loop().call_soon(\n'
        "                self._log_creation, node, None\n"
        "            )  # planted: logged after the caller has its answer\n",
    ),
    Mutant(
        "effects_before_commit",
        "a turn's effects (spawns, messages, deliveries) are applied before turn.complete",
        "commit.py",
        '        return {"effects": effects.to_dict()}\n',
        "        self.apply_effects(node, effects.to_dict())  # planted: before the commit\n"
        '        return {"effects": effects.to_dict()}\n',
    ),
    Mutant(
        "delivered_on_claim",
        "check_inbox logs message.delivered when it claims messages, before the turn commits",
        "tools.py",
        "        taken = self._orch.inboxes.inbox(self._node.agent_id).claim(effects.turn_id)\n",
        "        taken = self._orch.inboxes.inbox(self._node.agent_id).claim(effects.turn_id)\n"
        "        if taken:  # planted: delivery logged before the turn's commit\n"
        "            self._orch.logs.get(self._node.session_id).log(\n"
        '                "message.delivered", {"message_ids": [m.message_id for m in taken]}\n'
        "            )\n",
    ),
    Mutant(
        "stale_blob_trusted",
        "a session is restored from its stored blob even when the log has newer turns",
        "live_sessions.py",
        "        current = session.state_seq >= self.last_complete_seq.get(node.agent_id, 0)\n",
        "        current = True  # planted: trust the blob whatever its age\n",
    ),
    Mutant(
        "commit_record_without_effects",
        "turn.complete is written without the turn's staged effects, so recovery cannot "
        "roll forward effects a crash cut off",
        "scheduler.py",
        "        data.update(commit(response, transcript))\n",
        "        commit(response, transcript)  # planted: the effects stay in memory only\n",
    ),
    # -- recovery ------------------------------------------------------------------------
    Mutant(
        "user_inbox_forgotten",
        "recovery rebuilds agents' inboxes but not the user's",
        "rollforward.py",
        "    pending: list[dict[str, Any]] = list(user.pending())\n",
        "    pending: list[dict[str, Any]] = []  # planted: the user's inbox is forgotten\n",
    ),
    Mutant(
        "no_message_roll_forward",
        "recovery does not re-send messages of committed turns that a crash cut off "
        "(the stranded reply)",
        "rollforward.py",
        "                if not target.received(data):\n",
        "                if False and not target.received(data):  # planted\n",
    ),
    Mutant(
        "no_cascade_on_recovery",
        "recovery does not finish a cascade termination that a crash cut short",
        "recovery.py",
        "                if parent_dead:\n",
        "                if False:  # planted: a cut-short cascade is left unfinished\n",
    ),
    Mutant(
        "terminated_record_left_live",
        "recovery skips marking the record of an agent whose log says terminated",
        "recovery.py",
        "        if f is not None and f.terminated:\n"
        "            store.transition(session, SessionState.TERMINATED)\n",
        "        if f is not None and f.terminated:\n"
        "            pass  # planted: the record keeps its live state\n",
    ),
    # -- checkpoints and segments -----------------------------------------------------
    Mutant(
        "checkpoint_trusted_unverified",
        "recovery uses a checkpoint without checking it against its log (the entry it "
        "names, where it names it)",
        "recovery_logs.py",
        "        reason = verify(checkpoint, path, sealed, first_active)\n",
        "        reason = None  # planted: the checkpoint is taken on trust\n",
    ),
    Mutant(
        "summary_entry_log_unchecked",
        "a start takes an agent from its start summary entry without comparing its log's "
        "fingerprint: a log that grew after the summary (a turn, then a crash before any "
        "checkpoint) is taken as it was",
        "start_summary.py",
        "            or fingerprint(st) != entry[1]  # its size: where the checkpoint ends (see build)\n",  # noqa: E501
        "",
    ),
    Mutant(
        "summary_quiet_log_unchecked",
        "a start takes a quiet agent from its start summary entry without comparing its "
        "log's fingerprint (the quiet pass's own check, inline): a log appended to under the "
        "summary (an agent.terminated by hand) is taken as it was",
        "recovery_quiet.py",
        "            fingerprint = entry[1]\n",
        "            fingerprint = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]\n",  # noqa: E501
    ),
    Mutant(
        "summary_not_retired_at_start",
        "a start leaves the start summary in place while it writes: a record it writes "
        "before a crash is taken from the summary's copy by the next start (nothing "
        "checks a record against the summary: only a clean stop's summary may exist)",
        "recovery.py",
        "            start_summary.retire(store.root)\n",
        "            pass  # planted: the summary is not retired\n",
    ),
    Mutant(
        "summary_retired_without_fsync",
        "a start removes the start summary without making the removal durable: a power "
        "loss after the start's first writes brings it back over them",
        "start_summary.py",
        "    try:\n        persistence.durable_unlink(path)\n    except OSError:\n",
        "    try:\n        os.path.lexists(path) and os.unlink(path)  # planted: not fsynced\n"
        "    except OSError:\n",
    ),
    Mutant(
        "summary_not_retired_by_repair",
        "fsck --repair writes (a record quarantined, a log rewritten) with the start "
        "summary still in place: a repair killed before its recovery leaves a summary "
        "that no longer says what the agents' files hold",
        "fsck_repair.py",
        "    start_summary.retire(root)\n",
        "    pass  # planted: the summary is not retired\n",
    ),
    Mutant(
        "summary_written_while_open",
        "a checkpoint of every log writes the start summary while the root stays open: "
        "what the orchestrator writes after it, before a crash, is not what the summary "
        "says (only a clean stop, after its last write, may write one)",
        "orchestrator.py",
        "        # no start summary here: only a clean stop writes one, after its last write\n",
        "        if agent is None:  # planted: a summary while the root stays open\n"
        "            self.checkpointer.summarize()\n",
    ),
    Mutant(
        "summary_pending_replayed",
        "a pending entry put by hand beside a log the start summary gave is replayed at "
        "the agent's first use: the log gets an entry the state served does not have",
        "eventlog.py",
        "            if replay is not None and resume is not None and resume.summarized:\n",
        "            if False:  # planted: replayed as after a crash\n",
    ),
    Mutant(
        "summary_entry_over_a_tail",
        "the start summary holds an entry for an agent whose log has entries past its "
        "newest checkpoint (not yet checkpointed): a start takes the checkpoint's facts "
        "and misses them",
        "start_summary.py",
        "    if log_st.st_size != at.offset + at.length or line_mismatch(at, line) is not None:\n",
        "    if line_mismatch(at, line) is not None:  # planted: the tail is not looked at\n",
    ),
    Mutant(
        "lazy_node_forgets_children",
        "a quiet agent's node built after the start (substrat.lazy) does not take the "
        "children added under it while it was a row: the tree loses them below it",
        "agents.py",
        "        if kids is not None:\n",
        "        if False:  # planted: the children added under the row are dropped\n",
    ),
    Mutant(
        "lazy_turn_counter_from_nothing",
        "a quiet agent's turn counter built after the start starts from zero, not from "
        "its summary row: its next turn reuses a turn number its log already has",
        "restore.py",
        "    turns: int = row[1] + row[2]\n",
        "    turns: int = 0  # planted: the row's turns are not counted\n",
    ),
    Mutant(
        "lazy_iteration_skips_rows",
        "iterating a lazily built map (the tree's nodes, the records, the counters) sees "
        "only the values built so far: a listing after a start from the summary misses "
        "the agents nothing has touched yet",
        "lazy.py",
        "    def values(self) -> dict_values[K, V]:\n        self.build_all()\n",
        "    def values(self) -> dict_values[K, V]:\n        pass  # planted: rows not built\n",
    ),
    Mutant(
        "history_drops_a_middle_turn",
        "Orchestrator.history rebuilds a conversation without its second turn (a reader "
        "that loses an entry from the middle of a log): only a check that rebuilds whole "
        "conversations through the read path sees it, not one fed by the appended bytes",
        "queries.py",
        "        return conversation_from_log(self.logs.path(self.lookup(agent).session_id))\n",
        "        turns = conversation_from_log(self.logs.path(self.lookup(agent).session_id))\n"
        "        return turns[:1] + turns[2:]  # planted: the second turn is lost\n",
    ),
    Mutant(
        "history_swaps_middle_turns",
        "the log's reader rebuilds a conversation with its second and third turns in each "
        "other's place (damage in the middle, as many turns as before): only a check that "
        "reads whole conversations through the read path sees it, not one that decodes the "
        "appended lines or a new agent's first lines itself",
        "conversation.py",
        "    if base is None:\n        return conversation_from_entries(entries)\n",
        "    if base is None:\n        turns = conversation_from_entries(entries)\n"
        "        turns[1:3] = turns[2:0:-1]  # planted: two middle turns swapped\n"
        "        return turns\n",
    ),
    Mutant(
        "envelope_batch_check_skips_a_field",
        "the check of many pending messages at once (a checkpoint's, at a start) does not "
        "look at their timestamps: a message whose timestamp is no string is taken as an "
        "envelope this version can deliver",
        "agents.py",
        '_STRINGS = ("message_id", "sender", "recipient", "payload", "timestamp")\n',
        '_STRINGS = ("message_id", "sender", "recipient", "payload")  # planted\n',
    ),
    Mutant(
        "big_line_decoded_as_one_string",
        "every big log line is decoded by orjson as if it were one long string (a "
        "checkpoint's line in its store): a line of many values peaks at many times its "
        "size, as the daemon's peak memory did before the standard parser read big texts",
        "logline.py",
        "                elif one_string:  # read in place",
        "                elif True:  # planted: read in place",
    ),
    Mutant(
        "summary_vouches_for_user_facts_unread",
        "the clean stop writes the start summary's user entry though the user's facts do "
        "not read: the next start defers them and trusts every other checkpoint, so a "
        "message only a sender's log still had (its checkpoint forgot it) is not rolled "
        "forward when the user's log lost it too",
        "summary_user.py",
        "    except ValueError:\n"
        "        return None  # a start decodes it, and sets the store aside if it must\n",
        "    except ValueError:\n"
        "        return [log_fingerprint, [], []]  # planted: vouched for anyway\n",
    ),
    Mutant(
        "summary_user_log_unchecked",
        "a start defers the user's facts on the start summary's word without comparing the "
        "user's log with the entry: a message to the user logged after the summary (a turn, "
        "then a crash before any checkpoint) is not in the inbox",
        "recovery_user.py",
        "        fingerprint(st) != log_fingerprint\n"
        "        or st.st_size != at.offset + at.length\n",
        "        False  # planted: the user's log is not compared with the entry\n",
    ),
    Mutant(
        "summary_quiet_kept_when_set_aside",
        "a start that sets every checkpoint aside (another log lost entries) keeps the quiet "
        "agents it took whole from the start summary, whose facts come from their "
        "checkpoints, instead of reading their logs in full",
        "recovery.py",
        "        for sid in list(quiet.rows):  # read as every other log, from their records on\n",
        "        for sid in []:  # planted: the quiet agents keep their checkpoints' facts\n",
    ),
    Mutant(
        "segment_removed_before_archive_durable",
        "archiving removes the plain segment before its compressed copy is durable",
        "segments.py",
        "    if not os.path.exists(target):\n"
        "        data = persistence.read_bytes(segment.path)\n"
        "        # mtime=0: the same segment always compresses to the same bytes\n"
        "        persistence.atomic_write(target, gzip.compress(data, GZIP_LEVEL, mtime=0))\n"
        "    persistence.durable_unlink(segment.path)\n",
        "    data = persistence.read_bytes(segment.path)\n"
        "    persistence.durable_unlink(segment.path)  # planted: the plain copy goes first\n"
        "    persistence.atomic_write(target, gzip.compress(data, GZIP_LEVEL, mtime=0))\n",
    ),
    Mutant(
        "segment_deleted_before_covering_checkpoint_durable",
        "the delete policy removes segments while the checkpoint covering them is not "
        "durable: the log's base, which holds it, is written without fsync",
        "logbase.py",
        "    persistence.atomic_write(base_path(log_path), line)\n",
        "    with open(base_path(log_path), 'wb') as handle:  # planted: never fsynced\n"
        "        handle.write(line)\n",
    ),
    Mutant(
        "segment_deleted_before_base_written",
        "the delete policy removes segments first and writes the log's base (the covering "
        "checkpoint, their turns) after",
        "logbase.py",
        "    write_base(log_path, LogBase(through, checkpoint.held(), turns), clock)\n"
        "    for segment in victims:\n"
        "        delete_segment(segment)\n",
        "    for segment in victims:  # planted: the segments go before their base is written\n"
        "        delete_segment(segment)\n"
        "    write_base(log_path, LogBase(through, checkpoint.held(), turns), clock)\n",
    ),
    Mutant(
        "log_start_before_roll",
        "a roll writes the log's start record (where the new active file starts) before it "
        "renames the active file, so a crash in between leaves a record ahead of the log",
        "segments.py",
        "    persistence.durable_rename(active, target)\n"
        "    persistence.durable_create(active)\n"
        "    sealed = Segment(first, last, target)\n"
        "    try:\n"
        "        write_start(active, last + 1)  # after the rename: never ahead of the active file\n",  # noqa: E501
        "    write_start(active, last + 1)  # planted: the record before the rename\n"
        "    persistence.durable_rename(active, target)\n"
        "    persistence.durable_create(active)\n"
        "    sealed = Segment(first, last, target)\n"
        "    try:\n"
        "        pass  # planted: written above\n",
    ),
    Mutant(
        "deletes_the_checkpoints_own_segment",
        "the delete policy removes every sealed segment the checkpoint reaches into: the one "
        "holding its entry (which may hold entries after it) and the newest sealed one",
        "logbase.py",
        "    return [s for s in sealed[:-1] if s.last < checkpoint.at.file_first]\n",
        "    return [s for s in sealed if s.first <= checkpoint.at.seq]  # planted\n",
    ),
    *EDGES,
    *EIO_IN_MEMORY,
)


def by_name() -> dict[str, Mutant]:
    names = [m.name for m in CATALOG]
    assert len(names) == len(set(names)), "mutant names must be unique"
    return {m.name: m for m in CATALOG}
