"""How a cause reads: paths shortened to the root and the source tree, a summary and a fix.

:mod:`faultfs._causes` finds which durability step a failing image relied on
(a :class:`~faultfs._causes.Finding` made of :class:`~faultfs._causes.Step`s);
this module words it for a person: the file, the lines, what was missing and
what to add.
"""

from __future__ import annotations

from dataclasses import dataclass

from faultfs._causes import Step
from faultfs._trace import WORKER_FILE

# Callers shown after an operation's own frame in a report.
SHOWN_CALLERS = 2


@dataclass(frozen=True)
class Where:
    """How a report shortens paths: file paths relative to the FaultFS root, sources to a dir."""

    root: str
    source_root: str | None = None

    def path(self, path: str) -> str:
        if path == self.root:
            return "."
        if path.startswith(self.root + "/"):
            return path[len(self.root) + 1 :]
        return path

    def frames(self, step: Step) -> str:
        """The first frame outside faultfs, the first in the user's code, and two callers."""
        frames = step.frames
        if not frames:
            return "<unknown>"
        src = self.source_root
        text = f"{frames[0].display(src)} ({frames[0].function})"
        worker = next((i for i, f in enumerate(frames) if f.file == WORKER_FILE), None)
        if worker is not None:  # a pool's thread ran a built-in: say who submitted the work
            submitted = frames[worker + 1 :]
            if not submitted:
                return text + " in a worker thread (who submitted the work is not known)"
            by = next((i for i, f in enumerate(submitted) if not f.in_stdlib), 0)
            text += " in a worker thread, for work submitted at "
            text += f"{submitted[by].display(src)} ({submitted[by].function})"
            for caller in submitted[by + 1 :][:SHOWN_CALLERS]:
                text += f" <- {caller.display(src)} ({caller.function})"
            return text
        rest = frames[1:]
        if frames[0].in_stdlib:
            user = next((i for i, f in enumerate(frames) if not f.in_stdlib), None)
            if user is not None:
                text += f", called from {frames[user].display(src)} ({frames[user].function})"
                rest = frames[user + 1 :]
        for caller in rest[:SHOWN_CALLERS]:
            text += f" <- {caller.display(src)} ({caller.function})"
        return text

    def site(self, step: Step) -> str:
        user = next((f for f in step.frames if not f.in_stdlib), None)
        frame = user or (step.frames[0] if step.frames else None)
        return frame.display(self.source_root) if frame is not None else "<unknown>"


def describe(kind: str, steps: tuple[Step, ...], note: str, where: Where) -> tuple[str, str]:
    """(summary, fix) of a cause, with paths shortened by ``where``."""
    by_role: dict[str, list[Step]] = {}
    for step in steps:
        by_role.setdefault(step.role, []).append(step)

    def at(role: str) -> str:
        return " and ".join(sorted({where.site(s) for s in by_role.get(role, [])})) or "?"

    def first(role: str) -> Step | None:
        found = by_role.get(role)
        return found[0] if found else None

    write = first("write")
    # The file the cause is about: its write, or its lost truncate when nothing was written.
    subject = write or first("truncate")
    file = where.path(subject.path) if subject is not None else "?"
    written_files = {where.path(s.path) for s in by_role.get("write", [])}

    def written() -> str:
        """Each written file with its write sites: one unsynced cause can span files."""
        sites: dict[str, set[str]] = {}
        for step in by_role.get("write", []):
            sites.setdefault(where.path(step.path), set()).add(where.site(step))
        if not sites:
            return f"{file} at ?"
        # Files written by the same lines (a temporary file per save) read as one pattern.
        by_sites: dict[tuple[str, ...], list[str]] = {}
        for name, at_sites in sites.items():
            by_sites.setdefault(tuple(sorted(at_sites)), []).append(name)
        return " and to ".join(
            f"{_pattern(names)} at {' and '.join(lines)}" for lines, names in by_sites.items()
        )

    the_file = "each of these files" if len(written_files) > 1 else "the file"
    acked = ""
    if "acknowledged" in by_role:
        acked = f" before it was acknowledged at {at('acknowledged')}"
    elif "then" in by_role:
        then = by_role["then"][0]
        acked = f" before the {then.kind} of {where.path(then.path)} at {at('then')}"
    if kind == "unsynced-before-rename":
        publisher = first("rename") or first("link")
        verb = publisher.kind if publisher is not None else "rename"
        summary = (
            f"data written to {written()} was never fsynced before the {verb} at "
            f"{at(verb)} made it visible"
        )
        return (
            summary,
            f"fsync {the_file} before the {verb} (os.fsync on its descriptor after the last "
            "write; with a Python file object, f.flush() before it)",
        )
    if kind == "unsynced-before-ack":
        summary = f"data written to {written()} was never fsynced{acked}"
        return (
            summary,
            f"fsync {the_file} before acknowledging (or acknowledge only after an fsync returned)",
        )
    if kind == "unsynced-data":
        if acked:
            summary = f"data written to {written()} was never fsynced{acked}"
            return summary, f"fsync {the_file}{acked}"
        summary = f"data written to {written()} was never fsynced, and recovery needs it"
        return summary, f"fsync {the_file} after writing it"
    if kind == "in-place-rewrite":
        truncate = first("truncate")
        name = where.path(truncate.path) if truncate is not None else file
        if "write" in by_role:
            summary = (
                f"{name} was truncated at {at('truncate')} and rewritten at {at('write')} in "
                "place: the crash kept the truncation without the new data"
            )
        else:  # the crash came between the truncate and the first new write
            summary = (
                f"{name} was truncated at {at('truncate')} to be rewritten in place: a crash "
                "before the new data was written leaves it cut"
            )
        return summary, (
            "write the new content to a temporary file, fsync it, rename it over the old one, "
            "then fsync the directory"
        )
    if kind == "lost-truncate":
        summary = (
            f"the truncate of {file} at {at('truncate')} was never fsynced, and recovery needs it"
        )
        return summary, "fsync the file after truncating it"
    if kind == "entry-not-durable":
        entries = [s for s in steps if s.role not in ("acknowledged", "then")]
        if len(entries) > 1:
            summary, fix = _entries(entries, acked, where)
        else:
            summary, fix = _entry(entries[0] if entries else None, acked, where)
        if "then" in by_role:
            fix += f", before the {by_role['then'][0].kind} at {at('then')}"
        return summary, fix
    if kind == "fsync-error":
        summary = (
            f"data written to {file} at {at('write')} was dropped when the fsync at "
            f"{at('failed fsync')} failed"
        )
        if note:
            summary += f" ({note})"
        if "retried fsync" in by_role:
            summary += f"; the retried fsync at {at('retried fsync')} succeeded without writing it"
        if "acknowledged" in by_role:
            summary += f", and it was acknowledged at {at('acknowledged')}"
        return summary, (
            "after a failed fsync treat the unsynced data as lost: stop, or rewrite it and fsync "
            "again; a retried fsync returns success without writing the dropped pages"
        )
    if kind == "torn-write":
        summary = f"the write to {file} at {at('write')} was torn by the crash ({note})"
        if "recovery" in by_role:
            summary += f" and recovery failed on it at {at('recovery')}"
        log_fix = (
            "make each record self-checking (length and checksum) and have recovery cut a torn "
            "tail before reading or appending"
        )
        if write is not None and "off=0" in write.args:
            # A write from offset 0 is how a whole file is rewritten in place (TinyDB's
            # JSONStorage), though it can also be a fresh log's first record.
            return summary, (
                "if the file is rewritten whole, write a temporary file, fsync it and rename it "
                f"over the old one instead; if it is a log, {log_fix}"
            )
        return summary, log_fix
    if kind == "buffered-ack":
        held = sorted({where.path(s.path) for s in by_role.get("still buffered", [])})
        names = " and ".join(held) or "?"
        summary = (
            f"acknowledged at {at('acknowledged')} while data written to {names} was still in "
            "the process's buffer (a Python file object that was never flushed): the process "
            "never wrote it to the OS, so a crash loses it however the disk behaves"
        )
        return summary, (
            "flush the file object (f.flush()) before acknowledging, and fsync it "
            "(os.fsync(f.fileno())) too if the acknowledgement must survive a power loss"
        )
    if kind == "lost-together":
        parts = ", ".join(f"{s.kind} {where.path(s.path)} at {where.site(s)}" for s in steps)
        summary = f"losing these unsynced operations together breaks recovery: {parts}"
        return summary, "fsync them (and their directories) before relying on them"
    if not steps:
        summary = "the starting state fails the check even with nothing lost"
    else:
        # Crash points after several operations of one line (a helper making a tree) merge.
        paths: dict[str, list[str]] = {}
        for step in steps:
            known = paths.setdefault(step.kind, [])
            if where.path(step.path) not in known:
                known.append(where.path(step.path))
        done = [
            f"the {kind}{'s' if len(names) > 1 else ''} of {_pattern(names)}"
            for kind, names in paths.items()
        ]
        single = len(done) == 1 and len(paths[steps[0].kind]) == 1
        which = done[0] if single else "any of " + _listed(done)
        sites = " and ".join(sorted({where.site(s) for s in steps}))
        summary = (
            f"a crash right after {which} at {sites} leaves a state recovery rejects even with "
            "every write on the disk (a kill -9 shows it too)"
        )
    return summary, (
        "make the update atomic (write a new file, fsync it, rename it into place) or make "
        "recovery accept this intermediate state"
    )


def _entry(entry: Step | None, acked: str, where: Where) -> tuple[str, str]:
    if entry is None:
        return "a directory entry was never made durable", "fsync the directory"
    path = where.path(entry.path)
    parent = where.path(entry.path.rsplit("/", 1)[0] or "/")
    site = where.site(entry)
    if entry.kind == "rename":
        dst = str(entry.args[0]).removeprefix("-> ") if entry.args else "?"
        summary = (
            f"the rename of {path} to {where.path(dst)} at {site} was never made durable{acked}"
        )
        dst_parent = where.path(dst.rsplit("/", 1)[0] or "/")
        dirs = parent if dst_parent == parent else f"{dst_parent} and {parent}"
        return summary, f"fsync the directory ({dirs}) after the rename"
    if entry.kind == "mkdir":
        summary = f"the directory {path} created at {site} was never made durable{acked}"
        return summary, f"fsync its parent directory ({parent}) after mkdir"
    if entry.kind in ("unlink", "rmdir"):
        summary = f"the removal of {path} at {site} was never made durable{acked}"
        return summary, f"fsync its directory ({parent}) after removing it"
    if entry.kind == "link":
        summary = f"the link {path} created at {site} was never made durable{acked}"
        return summary, f"fsync its directory ({parent}) after linking"
    summary = f"the entry {path} created at {site} was never made durable{acked}"
    return summary, f"fsync its directory ({parent}) after creating it"


NAMED_ENTRIES = 4
"""Entries a summary names before it says how many more there are."""
"""Entries a summary names before it says how many more there are."""
RANDOM_PART = 5
"""Differing characters from which same-length names read as random (mkstemp draws 8)."""
_PLURAL = {
    "mkdir": ("the directories", "created"),
    "rename": ("the renames of", ""),
    "unlink": ("the removals of", ""),
    "rmdir": ("the removals of", ""),
    "link": ("the links", "created"),
}


def _entries(entries: list[Step], acked: str, where: Where) -> tuple[str, str]:
    """Several directory entries from one line (a helper making a tree), named together."""
    kind = entries[0].kind
    sources: dict[str, list[str]] = {}  # target (or "" when not a rename) -> names
    parents: list[str] = []
    for step in entries:
        path = where.path(step.path)
        target = ""
        if step.kind == "rename":
            dst = str(step.args[0]).removeprefix("-> ") if step.args else "?"
            target = where.path(dst)
            dirs = [dst.rsplit("/", 1)[0] or "/", step.path.rsplit("/", 1)[0] or "/"]
        else:
            dirs = [step.path.rsplit("/", 1)[0] or "/"]
        known = sources.setdefault(target, [])
        if path not in known:
            known.append(path)
        for directory in map(where.path, dirs):
            if directory not in parents:  # a rename within one directory names it once
                parents.append(directory)
    names = sources.pop("", [])
    # Temporary files renamed over one name read as one pattern.
    names += [f"{_pattern(srcs)} to {target}" for target, srcs in sources.items()]
    shown = _listed(names)
    what, verb = _PLURAL.get(kind, ("the entries", "created"))
    sites = " and ".join(sorted({where.site(s) for s in entries}))
    verb = f" {verb}" if verb else ""
    they = acked.replace(" it was ", " they were ")
    summary = f"{what} {shown}{verb} at {sites} were never made durable{they}"
    directories = ("directory" if len(parents) == 1 else "directories") + f" ({', '.join(parents)})"
    fixes = {
        "mkdir": f"fsync their parent {directories} after mkdir",
        "rename": f"fsync the {directories} after the renames",
        "unlink": f"fsync their {directories} after removing them",
        "rmdir": f"fsync their {directories} after removing them",
        "link": f"fsync their {directories} after linking",
    }
    return summary, fixes.get(kind, f"fsync their {directories} after creating them")


def _listed(names: list[str]) -> str:
    """``a, b and c``; past NAMED_ENTRIES, ``a, b, c, d and 3 more``."""
    if len(names) > NAMED_ENTRIES:
        return ", ".join(names[:NAMED_ENTRIES]) + f" and {len(names) - NAMED_ENTRIES} more"
    if len(names) > 1:
        return ", ".join(names[:-1]) + f" and {names[-1]}"
    return names[0] if names else "?"


def _pattern(names: list[str]) -> str:
    """Names, or the pattern random temporary names share: ``tmpXXXXXXXX (3 files)``
    for ``tmp3f9a0c1d``, ``tmpx0c2k9q4`` and ``tmpp1b7z0w2``, not every name a run drew."""
    heads = {name.rpartition("/")[0] for name in names}
    bases = [name.rpartition("/")[2] for name in names]
    prefix = _common_start(bases)
    suffix = _common_start([b[len(prefix) :][::-1] for b in bases])[::-1]
    # A shared suffix is an extension (".json"), not random letters alike by chance.
    cut = next((i for i, c in enumerate(suffix) if not c.isalnum()), len(suffix))
    suffix = suffix[cut:]
    widths = {len(b) - len(prefix) - len(suffix) for b in bases}
    if len(names) < 2 or len(heads) != 1 or len(widths) != 1 or min(widths) < RANDOM_PART:
        return _listed(names)  # names chosen, not drawn (q00000 and q00001)
    head = heads.pop()
    return f"{head + '/' if head else ''}{prefix}{'X' * widths.pop()}{suffix} ({len(names)} files)"


def _common_start(texts: list[str]) -> str:
    """The characters every text starts with."""
    first, last = min(texts), max(texts)
    size = next((i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b), None)
    return first if size is None else first[:size]


def exception_words(exc: BaseException) -> str:
    """``Type: message``, or the type alone when the exception carries no message
    (``EOFError()`` from a cut pickle), not ``Type: `` with nothing after it."""
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
