"""Catalog mutants that only an I/O error shows, and only in the running process: an
operation refused by EIO that the running orchestrator's memory shows as done anyway
(or that hides what was acknowledged before it). Nothing is lost on the disk, and a
restart shows the right state again, so a crash right after the error hides them;
the crash fuzzer's EIO rules kill them by checking the running state and going on
(oracle.refused, docs/mutants.md). Part of :data:`oracle.mutant_catalog.CATALOG`."""

from __future__ import annotations

from oracle.mutant_def import Mutant

EIO_IN_MEMORY: tuple[Mutant, ...] = (
    Mutant(
        "user_ack_hides_before_durable",
        "the user's acknowledge takes the messages out of the running inbox before its entry "
        "is durable: after a failed acknowledge they are hidden until a restart",
        "orchestrator.py",
        '            self.logs.get(USER).log(events.MESSAGE_DELIVERED, {"message_ids": present})\n'
        "            inbox.remove(present)\n",
        "            inbox.remove(present)  # planted: before the entry is durable\n"
        '            self.logs.get(USER).log(events.MESSAGE_DELIVERED, {"message_ids": present})\n',
    ),
    Mutant(
        "failed_turn_messages_delivered",
        "a turn that failed (its commit refused by EIO) still hands its messages to the running "
        "recipients' inboxes: a send reported failed is read by its recipient",
        "orchestrator.py",
        "            self.mux.discard(node)\n            inbox.release(effects.turn_id)\n",
        "            self.mux.discard(node)\n"
        "            inbox.release(effects.turn_id)\n"
        "            for data in effects.messages:  # planted: sent though the commit failed\n"
        "                self.inboxes.deliver(MessageEnvelope.from_dict(data))\n",
    ),
)
