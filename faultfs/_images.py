"""Crash images: the disk states a crash at this point may leave, per mode and profile.

* process: everything the process saw (the page cache survives a kill -9).
* power: only the durable layer.
* torn: power, with one unsynced write of one file half-done in one of the
  shapes the profile allows (block-aligned parts, zeros or garbage in an
  extension, LazyFS's byte-granular parts).
* reorder: power plus a subset of the unsynced operations, closed under the
  profile's ordering rules (a journal persists namespace changes in order;
  auto_da_alloc forces a replaced file's data out with the rename).

An image is a fresh Model in which visible and durable agree and nothing is
pending: the state a rebooted machine would read.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

from faultfs._model import ROOT_INO, WRITE, DataOp, Edit, Inode, Model, apply_data_ops
from faultfs._process_model import need_durable

MODES = ("process", "power", "torn", "reorder")
# Enumerating all subsets is exact below this many unsynced operations.
MAX_EXHAUSTIVE_UNITS = 10
# A write spanning many blocks is torn at no more than this many boundaries.
MAX_CUTS_PER_WRITE = 4
# LazyFS's torn-op fault splits a write into this many equal parts (its
# documented example, parts=3).
LAZYFS_PARTS = 3


@dataclass(frozen=True)
class ImageChoice:
    """Which unsynced changes an image keeps on top of the durable layer."""

    meta: frozenset[int] = frozenset()  # indexes into Model.meta_pending
    data: frozenset[int] = frozenset()  # gseqs of pending data operations kept
    tear: tuple[int, bytes] | None = None  # (inode, the torn file's whole content)
    torn: int | None = None  # gseq of the torn write (earlier writes of its file landed)
    everything: bool = False  # the process image: the page cache survived
    detail: str = field(default="", compare=False)


Fingerprint = tuple[tuple[str, bytes | None], ...]
"""Every path of a tree with its bytes (None for a directory), sorted: see :func:`fingerprint`."""


@dataclass
class Reached:
    """What an image holds, before it is built: each reachable inode's entries or bytes.

    Building a Model costs an Inode per file and directory; comparing candidate
    images only needs these values, so the torn and reorder modes build only the
    candidates whose content is new (about half of them are not).
    """

    values: dict[int, dict[str, int] | bytes]
    """Inode -> its entries (a directory) or its content (a file), in the order reached."""
    dirs: set[int]


def _reach(
    model: Model,
    entries_of: Callable[[Inode], dict[str, int]],
    content_of: Callable[[Inode], bytes],
) -> Reached:
    """Walk the namespace from the root: what is reachable, as :class:`Reached`."""
    src = model.inodes
    values: dict[int, dict[str, int] | bytes] = {}
    dirs: set[int] = set()
    stack = [ROOT_INO]
    while stack:
        ino = stack.pop()
        node = src[ino]
        if not node.is_dir:
            values[ino] = content_of(node)
            continue
        dirs.add(ino)
        entries: dict[str, int] = {}
        values[ino] = entries
        for name, target in entries_of(node).items():
            if src[target].is_dir:
                if target in dirs or target in values:
                    continue  # a directory reachable twice (torn renames): keep the first
                stack.append(target)
            elif target not in values and target not in stack:
                stack.append(target)
            entries[name] = target
    return Reached(values, dirs)


def build(model: Model, reached: Reached) -> Model:
    """A new Model holding ``reached`` (of ``model``), visible and durable alike (it
    takes over ``reached``'s directories: build each one once)."""
    image = Model(model.profile)
    image.inodes = {}
    src = model.inodes
    for ino, value in reached.values.items():
        node = src[ino]
        twin = Inode(ino, node.is_dir, node.mode, node.mtime_ns)
        image.inodes[ino] = twin
        if ino in reached.dirs:
            twin.nlink = 2 if ino == ROOT_INO else 1
            twin.entries = value  # type: ignore[assignment]
            twin.durable_entries = dict(value)  # type: ignore[arg-type]
        else:
            twin.data = twin.durable = value  # type: ignore[assignment]
    for node in image.inodes.values():
        if node.is_dir:
            for target in node.entries.values():
                image.inodes[target].nlink += 1
    image.next_ino = max(model.next_ino, max(image.inodes) + 1)
    image.clock = model.clock  # keeps operation order monotonic across crashes
    return image


def process_image(model: Model) -> Model:
    def content(node: Inode) -> bytes:
        if type(node.data) is bytearray:
            node.data = bytes(node.data)  # share, copy on the next write
        return node.data  # type: ignore[return-value]

    return build(model, _reach(model, lambda node: node.entries, content))


def durable_reach(model: Model, choice: ImageChoice) -> Reached:
    """What :func:`durable_image` holds, not built (:func:`reached_fingerprint`, :func:`build`)."""
    need_durable(model, "a power, torn or reorder image")
    inodes = model.inodes
    overlays: dict[int, dict[str, int]] = {}
    kept = set(choice.data)
    for index in sorted(choice.meta):
        op = model.meta_pending[index]
        for dir_ino, name, target in op.edits:
            entries = overlays.get(dir_ino)
            if entries is None:
                entries = overlays[dir_ino] = dict(inodes[dir_ino].durable_entries)
            if target is None:
                entries.pop(name, None)
            else:
                entries[name] = target
        if op.flush is not None:
            ino, upto = op.flush
            kept.update(g for g, *_ in inodes[ino].pending if g <= upto)
    torn_ino, torn_bytes = choice.tear if choice.tear is not None else (None, b"")

    def content(node: Inode) -> bytes:
        if node.ino == torn_ino:
            return torn_bytes
        if kept and node.pending:
            ops = [op for op in node.pending if op[0] in kept]
            if ops:
                return apply_data_ops(node.durable, ops)
        return node.durable

    return _reach(model, lambda node: overlays.get(node.ino, node.durable_entries), content)


def durable_image(model: Model, choice: ImageChoice) -> Model:
    """The durable layer plus the unsynced changes ``choice`` keeps."""
    return build(model, durable_reach(model, choice))


def reached_fingerprint(reached: Reached) -> Fingerprint:
    """:func:`fingerprint` of the Model :func:`build` would make of ``reached``."""
    values, dirs = reached.values, reached.dirs
    out: list[tuple[str, bytes | None]] = []
    stack = [("", ROOT_INO)]
    while stack:
        path, ino = stack.pop()
        value = values[ino]
        if ino in dirs:
            out.append((path + "/", None))
            stack.extend((f"{path}/{name}", target) for name, target in value.items())  # type: ignore[union-attr]
        else:
            out.append((path, bytes(value)))  # type: ignore[arg-type]
    out.sort(key=lambda item: item[0])
    return tuple(out)


def fingerprint(model: Model) -> Fingerprint:
    """A value equal for two models exactly when their trees hold the same content."""
    out: list[tuple[str, bytes | None]] = []
    stack = [("", ROOT_INO)]
    while stack:
        path, ino = stack.pop()
        node = model.inodes[ino]
        if node.is_dir:
            out.append((path + "/", None))
            stack.extend((f"{path}/{name}", target) for name, target in node.entries.items())
        else:
            out.append((path, bytes(node.data)))
    out.sort(key=lambda item: item[0])
    return tuple(out)


def durable_files(model: Model) -> list[tuple[str, Inode]]:
    """Files reachable through durable entries, by path (the power image's namespace)."""
    need_durable(model, "a torn image")
    found: list[tuple[str, Inode]] = []
    stack = [("", ROOT_INO)]
    seen: set[int] = set()
    while stack:
        path, ino = stack.pop()
        if ino in seen:
            continue
        seen.add(ino)
        node = model.inodes[ino]
        if node.is_dir:
            stack.extend((f"{path}/{n}", t) for n, t in node.durable_entries.items())
        else:
            found.append((path, node))
    found.sort(key=lambda item: item[0])
    return found


# -------------------------------------------------------------------- torn


def _tears(
    prior: bytes,
    offset: int,
    payload: bytes,
    block_size: int,
    rng: random.Random,
    shapes: frozenset[str],
) -> Iterator[tuple[str, Callable[[], bytes]]]:
    """The ``shapes`` in which one write can be half-done on the disk, given the bytes
    before it: each shape's description and how to build the file's content (built only
    for the shape an image takes; the random bytes are drawn in order all the same)."""
    if not payload:
        return
    end = offset + len(payload)
    size = len(prior)
    if end > size:
        if "zeros" in shapes:
            yield "size extended, data zeros", lambda: prior + bytes(end - size)
        if "garbage" in shapes:
            noise = rng.randbytes(end - size)
            yield "size extended, garbage", lambda: prior + noise
    cuts = list(range((offset // block_size + 1) * block_size, end, block_size))
    if len(cuts) > MAX_CUTS_PER_WRITE:
        step = (len(cuts) - 1) / (MAX_CUTS_PER_WRITE - 1)
        cuts = sorted({cuts[round(i * step)] for i in range(MAX_CUTS_PER_WRITE)})
    blocks = len(cuts) + 1
    for cut in cuts:
        head_ops: list[DataOp] = [(0, WRITE, offset, payload[: cut - offset])]
        if "prefix" in shapes:
            yield (
                f"first blocks up to byte {cut} of {blocks} blocks landed",
                partial(apply_data_ops, prior, head_ops),
            )
        # the head's length, as apply_data_ops leaves it: the write's end or the old size
        if "prefix-zeros" in shapes and end > max(size, cut):
            yield (
                f"first blocks up to byte {cut} landed, zero tail",
                partial(_zero_tail, prior, head_ops, end),
            )
        if "suffix" in shapes:
            tail_ops: list[DataOp] = [(0, WRITE, cut, payload[cut - offset :])]
            yield (
                f"blocks from byte {cut} landed (hole before)",
                partial(apply_data_ops, prior, tail_ops),
            )
    if "parts" in shapes:
        for persisted, parts in lazyfs_parts(len(payload)):
            ops = [(0, WRITE, offset + start, payload[start:stop]) for start, stop in parts]
            yield f"parts {persisted} of {LAZYFS_PARTS} landed", partial(apply_data_ops, prior, ops)


def _zero_tail(prior: bytes, ops: list[DataOp], end: int) -> bytes:
    head = apply_data_ops(prior, ops)
    return head + bytes(end - len(head))


def lazyfs_parts(length: int) -> Iterator[tuple[tuple[int, ...], list[tuple[int, int]]]]:
    """LazyFS torn-op with ``parts=3``: each proper subset of parts, as byte ranges.

    As in LazyFS's split_write, a part is ``length // 3`` bytes and the
    remainder joins the last part of the persisted subset.
    """
    each, extra = divmod(length, LAZYFS_PARTS)
    for count in range(1, LAZYFS_PARTS):
        for persisted in itertools.combinations(range(1, LAZYFS_PARTS + 1), count):
            ranges = []
            for number in persisted:
                start = (number - 1) * each
                stop = start + each + (extra if number == persisted[-1] else 0)
                if stop > start:
                    ranges.append((start, stop))
            if ranges:
                yield persisted, ranges


def torn_choices(model: Model, block_size: int, seed: int) -> Iterator[ImageChoice]:
    for torn in torn_candidates(model, block_size, seed):
        yield torn.choice()


@dataclass(frozen=True)
class TornCandidate:
    """One torn write, its content not built yet (:meth:`choice` builds it)."""

    ino: int
    gseq: int
    detail: str
    content: Callable[[], bytes]

    def choice(self) -> ImageChoice:
        return ImageChoice(tear=(self.ino, self.content()), torn=self.gseq, detail=self.detail)


def torn_candidates(model: Model, block_size: int, seed: int) -> Iterator[TornCandidate]:
    """:func:`torn_choices` in the same order, each content built only when asked for
    (sampling one image of many builds one file, not every candidate's)."""
    rng = random.Random(seed)
    for path, node in durable_files(model):
        prior = node.durable
        for index, op in enumerate(node.pending):
            _gseq, kind, arg, payload = op
            if kind == WRITE:
                tears = _tears(prior, arg, payload, block_size, rng, model.profile.torn_shapes)
                for detail, content in tears:
                    yield TornCandidate(
                        node.ino,
                        op[0],
                        f"{path}: unsynced write #{index} (off={arg} len={len(payload)}) "
                        f"torn: {detail}",
                        content,
                    )
            prior = apply_data_ops(prior, [op])


# ----------------------------------------------------------------- reorder

# One unsynced operation: ("meta", index into meta_pending) or ("data", gseq).
Unit = tuple[str, int]


def _describe_meta(kind: str, edits: tuple[Edit, ...], dirs: dict[int, str]) -> str:
    """An unsynced namespace change as a reader names it: ``rename a.tmp -> a``, ``unlink a``."""

    def entry(edit: Edit) -> str:
        return dirs.get(edit[0], "?/") + edit[1]

    if len(edits) == 2 and edits[0][2] is not None and edits[1][2] is None:
        # A rename (or replace) edits the target's entry first, then drops the source's.
        return f"{kind} {entry(edits[1])} -> {entry(edits[0])}"
    if kind == "rename" and len(edits) == 1:
        # One directory's half of a rename between directories (the other half is durable).
        return f"rename {'from' if edits[0][2] is None else 'to'} {entry(edits[0])}"
    return f"{kind} " + ", ".join(entry(edit) for edit in edits)


def _visible_paths(model: Model) -> tuple[dict[int, str], dict[int, str]]:
    """(each directory's path prefix, each file's path) below the root as the program sees them.

    A directory's prefix is "" for the root and ends with "/" otherwise; a file
    with several names gets one of them.
    """
    dirs: dict[int, str] = {ROOT_INO: ""}
    files: dict[int, str] = {}
    stack = [ROOT_INO]
    while stack:
        dir_ino = stack.pop()
        prefix = dirs[dir_ino]
        for name, ino in model.inodes[dir_ino].entries.items():
            if model.inodes[ino].is_dir:
                dirs[ino] = prefix + name + "/"
                stack.append(ino)
            else:
                files.setdefault(ino, prefix + name)
    return dirs, files


def _units(model: Model) -> list[tuple[int, Unit, str]]:
    need_durable(model, "a reorder image")
    units: list[tuple[int, Unit, str]] = []
    pending = [node for node in model.inodes.values() if node.pending and not node.is_dir]
    if not model.meta_pending and not pending:
        return units
    dirs, files = _visible_paths(model)
    for index, op in enumerate(model.meta_pending):
        units.append((op.gseq, ("meta", index), _describe_meta(op.kind, op.edits, dirs)))
    for node in pending:
        # A file may have been renamed or unlinked since the write: the inode is its
        # identity, and the name a reader knows it by is the one at the crash.
        name = files.get(node.ino)
        whose = f"inode {node.ino}, " + (f"{name} at the crash" if name else "unlinked")
        for gseq, kind, arg, payload in node.pending:
            what = f"write off={arg} len={len(payload)}" if kind == WRITE else f"truncate {arg}"
            units.append((gseq, ("data", gseq), f"{what} ({whose})"))
    units.sort()
    return units


def _close(model: Model, chosen: list[tuple[int, Unit, str]]) -> ImageChoice:
    meta = {u[1] for _, u, _ in chosen if u[0] == "meta"}
    data = {u[1] for _, u, _ in chosen if u[0] == "data"}
    if model.profile.meta_journal and meta:
        meta = set(range(max(meta) + 1))
    detail = "keeps: " + ("; ".join(d for _, _, d in chosen) if chosen else "nothing unsynced")
    return ImageChoice(meta=frozenset(meta), data=frozenset(data), detail=detail)


def _subsets(n: int, rng: random.Random) -> Iterator[tuple[int, ...]]:
    everything = tuple(range(n))
    if n <= MAX_EXHAUSTIVE_UNITS:
        for size in range(n + 1):
            yield from itertools.combinations(everything, size)
        return
    # Too many to enumerate: the subsets that find most ordering bugs first
    # (each operation alone, each one missing, every prefix), then random ones.
    yield ()
    yield from ((i,) for i in everything)
    yield from (everything[:i] + everything[i + 1 :] for i in everything)
    yield from (everything[:i] for i in range(2, n + 1))
    while True:
        yield tuple(i for i in everything if rng.random() < 0.5)


def reorder_choices(model: Model, seed: int) -> Iterator[ImageChoice]:
    """Choices in a fixed order (endless when the space is too big to enumerate)."""
    units = _units(model)
    rng = random.Random(seed)
    for subset in _subsets(len(units), rng):
        yield _close(model, [units[i] for i in subset])


def sample_reorder(model: Model, seed: int) -> ImageChoice:
    rng = random.Random(seed)
    units = _units(model)
    return _close(model, [u for u in units if rng.random() < 0.5])
