"""Catalog mutants at the edges of what a write and a crash can leave: a write that
comes up short, a line torn just before its newline, an open's unsynced cut of a
torn tail sealed into a segment. Random crash shapes reach each seldom or never;
the persistence fuzzer has a shape for each (docs/mutants.md). Part of
:data:`oracle.mutant_catalog.CATALOG`."""

from __future__ import annotations

from oracle.mutant_def import Mutant

EDGES: tuple[Mutant, ...] = (
    Mutant(
        "write_all_ignores_short_write",
        "write_all makes one os.write and drops what a short write did not take",
        "persistence.py",
        "    while view:\n        written = os.write(fd, view)\n",
        "    if view:  # planted: one write, its count not looped over\n"
        "        written = os.write(fd, view)\n",
    ),
    Mutant(
        "unterminated_last_line_accepted",
        "a log's last line without its newline is taken as whole when it decodes: not cut, "
        "so the next append is glued onto it",
        "logread.py",
        '            damage.add("torn_tail", start, raw, line_no, file)\n            break\n',
        "            if isinstance(decode_line(raw), str):  # planted: one that decodes is whole\n"
        '                damage.add("torn_tail", start, raw, line_no, file)\n'
        "                break\n"
        '            raw += b"\\n"\n',
    ),
    Mutant(
        "roll_renames_before_the_cut_is_durable",
        "a roll renames the active file into a segment before making its size durable: an "
        "open's unsynced cut of a torn tail comes back inside the sealed segment",
        "segments.py",
        "    persistence.durable_contents(active)\n"
        "    persistence.durable_rename(active, target)\n",
        "    persistence.durable_rename(active, target)  # planted: renamed first\n"
        "    persistence.durable_contents(target)\n",
    ),
)
