"""The page-cache model: what the process sees, what is durable, what is pending.

Every file inode holds the bytes the process sees (``data``), the bytes on the
disk (``durable``) and the unsynced data operations between them
(``pending``). Every directory inode holds its visible and durable entries;
namespace changes not yet durable sit in one ordered list (``meta_pending``).
Crash images are computed from these three layers (see ``_images``).

Invariant: unless an fsync failed (``diverged``), replaying ``pending`` onto
``durable`` gives ``data``. After a failed fsync the pending operations are
dropped without reaching the disk (Linux marks the pages clean), so the
visible bytes keep data the disk will never get.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Sequence

from faultfs._profiles import Profile

ROOT_INO = 1
WRITE = 0
TRUNCATE = 1

# (gseq, kind, offset-or-size, payload): one unsynced data operation.
DataOp = tuple[int, int, int, bytes]
# (directory inode, entry name, target inode or None for a removal).
Edit = tuple[int, str, int | None]


class Inode:
    """One file or directory; identity survives rename and link."""

    __slots__ = (
        "data",
        "diverged",
        "durable",
        "durable_entries",
        "entries",
        "ino",
        "is_dir",
        "mode",
        "mtime_ns",
        "nlink",
        "pending",
    )

    def __init__(self, ino: int, is_dir: bool, mode: int, mtime_ns: int = 0) -> None:
        self.ino = ino
        self.is_dir = is_dir
        self.mode = mode
        self.mtime_ns = mtime_ns
        self.nlink = 0
        # Files share immutable bytes with snapshots and images and turn them
        # into a bytearray on the first write (copy on write).
        self.data: bytes | bytearray = b""
        self.durable: bytes = b""
        self.pending: list[DataOp] = []
        self.diverged = False
        self.entries: dict[str, int] = {}
        self.durable_entries: dict[str, int] = {}

    def clone(self) -> Inode:
        twin = Inode(self.ino, self.is_dir, self.mode, self.mtime_ns)
        twin.nlink = self.nlink
        if self.is_dir:
            twin.entries = dict(self.entries)
            twin.durable_entries = dict(self.durable_entries)
        else:
            if type(self.data) is bytearray:
                self.data = bytes(self.data)
            twin.data = self.data
            twin.durable = self.durable
            twin.pending = list(self.pending)
            twin.diverged = self.diverged
        return twin


class MetaOp:
    """An unsynced namespace change: edits to one or two directories.

    ``flush`` names a file inode and a sequence number: when this change
    becomes durable, that file's data up to that point does too (ext4's
    auto_da_alloc on replace).
    """

    __slots__ = ("edits", "flush", "gseq", "kind")

    def __init__(
        self, gseq: int, kind: str, edits: tuple[Edit, ...], flush: tuple[int, int] | None
    ) -> None:
        self.gseq = gseq
        self.kind = kind
        self.edits = edits
        self.flush = flush

    def __repr__(self) -> str:
        return f"MetaOp({self.gseq}, {self.kind}, {self.edits}, flush={self.flush})"


def apply_data_ops(base: bytes, ops: Iterable[DataOp]) -> bytes:
    """Replay data operations onto ``base`` and return the resulting bytes."""
    buf = bytearray(base)
    for _gseq, kind, arg, payload in ops:
        if kind == WRITE:
            if not payload:
                continue  # a zero-length write never changes the size
            if arg > len(buf):
                buf.extend(bytes(arg - len(buf)))
            buf[arg : arg + len(payload)] = payload
        elif arg < len(buf):
            del buf[arg:]
        else:
            buf.extend(bytes(arg - len(buf)))
    return bytes(buf)


class Model:
    """All inodes of one simulated file system plus its unsynced namespace changes."""

    __slots__ = ("clock", "dropped", "inodes", "meta_pending", "next_ino", "profile")
    keeps_durable = True
    """False in :class:`faultfs._process_model.ProcessModel` (visible layer only)."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        root = Inode(ROOT_INO, True, 0o755)
        root.nlink = 2
        self.inodes: dict[int, Inode] = {ROOT_INO: root}
        self.next_ino = ROOT_INO + 1
        self.meta_pending: list[MetaOp] = []
        # Global sequence of mutations: orders data and namespace operations.
        self.clock = 0
        # Data a failed fsync dropped: (inode, clock of the failed fsync, ops).
        # Nothing reads it to build images (the data is gone); cause analysis
        # reads it to tell "lost to an fsync error" from other losses.
        self.dropped: list[tuple[int, int, tuple[DataOp, ...]]] = []

    # ----------------------------------------------------------------- copies

    def clone(self) -> Model:
        twin = type(self)(self.profile)
        twin.inodes = {ino: node.clone() for ino, node in self.inodes.items()}
        twin.next_ino = self.next_ino
        twin.meta_pending = list(self.meta_pending)
        twin.clock = self.clock
        twin.dropped = list(self.dropped)
        return twin

    def key(self) -> bytes:
        """Equal for two models equal in every field (the clock too): every crash image
        built from them is the same. Two crash points with equal keys need their images
        built once (a crash after one call and one before the next often are)."""
        nodes = [
            (n.ino, n.is_dir, n.mode, n.mtime_ns, n.nlink, n.data, n.durable, n.diverged)
            + (n.pending, n.entries, n.durable_entries)
            for n in self.inodes.values()
        ]
        meta = [(op.gseq, op.kind, op.edits, op.flush) for op in self.meta_pending]
        whole = (type(self).__name__, self.profile, self.clock, self.next_ino, self.dropped)
        return pickle.dumps((whole, nodes, meta))

    # -------------------------------------------------------------- namespace

    def new_inode(self, is_dir: bool, mode: int, mtime_ns: int) -> Inode:
        node = Inode(self.next_ino, is_dir, mode, mtime_ns)
        self.next_ino += 1
        self.inodes[node.ino] = node
        return node

    def edit_visible(
        self, kind: str, edits: tuple[Edit, ...], flush: tuple[int, int] | None = None
    ) -> None:
        """The visible half of :meth:`change_namespace` (all of it in a ProcessModel)."""
        inodes = self.inodes
        for dir_ino, name, target in edits:
            entries = inodes[dir_ino].entries
            old = entries.get(name)
            if old is not None:
                inodes[old].nlink -= 1
            if target is None:
                del entries[name]
            else:
                entries[name] = target
                inodes[target].nlink += 1
        self.clock += 1

    def change_namespace(
        self, kind: str, edits: tuple[Edit, ...], flush: tuple[int, int] | None = None
    ) -> None:
        """Apply ``edits`` to the visible entries; make them durable per the profile."""
        self.edit_visible(kind, edits)
        op = MetaOp(self.clock, kind, edits, flush if self.profile.replace_flushes_data else None)
        if self.profile.meta_immediate:
            self._commit_meta(op)
        else:
            self.meta_pending.append(op)

    def _commit_meta(self, op: MetaOp, edits: Sequence[Edit] | None = None) -> None:
        inodes = self.inodes
        for dir_ino, name, target in op.edits if edits is None else edits:
            durable = inodes[dir_ino].durable_entries
            if target is None:
                durable.pop(name, None)
            else:
                durable[name] = target
        if op.flush is not None:
            ino, upto = op.flush
            self.flush_data(inodes[ino], upto)

    def commit_all_meta(self) -> None:
        pending, self.meta_pending = self.meta_pending, []
        for op in pending:
            self._commit_meta(op)

    # ------------------------------------------------------------------- data

    def write_visible(self, node: Inode, offset: int, payload: bytes, mtime_ns: int) -> None:
        """The visible half of :meth:`write` (all of it in a ProcessModel)."""
        data = node.data
        if not isinstance(data, bytearray):
            data = node.data = bytearray(data)
        size = len(data)
        if offset > size and payload:
            data.extend(bytes(offset - size))
        data[offset : offset + len(payload)] = payload
        self.clock += 1
        node.mtime_ns = mtime_ns

    def write(self, node: Inode, offset: int, payload: bytes, mtime_ns: int) -> None:
        self.write_visible(node, offset, payload, mtime_ns)
        node.pending.append((self.clock, WRITE, offset, payload))

    def truncate_visible(self, node: Inode, size: int, mtime_ns: int) -> None:
        """The visible half of :meth:`truncate` (all of it in a ProcessModel)."""
        data = node.data
        if not isinstance(data, bytearray):
            data = node.data = bytearray(data)
        if size < len(data):
            del data[size:]
        else:
            data.extend(bytes(size - len(data)))
        self.clock += 1
        node.mtime_ns = mtime_ns

    def truncate(self, node: Inode, size: int, mtime_ns: int) -> None:
        self.truncate_visible(node, size, mtime_ns)
        node.pending.append((self.clock, TRUNCATE, size, b""))

    def flush_data(self, node: Inode, upto: int | None = None) -> None:
        """Make ``node``'s pending data durable (only ops with gseq <= ``upto``)."""
        pending = node.pending
        if not pending:
            return
        if upto is None or pending[-1][0] <= upto:
            if node.diverged:
                node.durable = apply_data_ops(node.durable, pending)
                node.diverged = node.durable != node.data
            else:
                node.durable = bytes(node.data)
            node.pending = []
            return
        count = 0
        while count < len(pending) and pending[count][0] <= upto:
            count += 1
        if count:
            node.durable = apply_data_ops(node.durable, pending[:count])
            node.pending = pending[count:]

    # ------------------------------------------------------------------- sync

    def fsync_file(self, node: Inode) -> None:
        if node.pending and not node.diverged:  # flush_data's common case, inlined
            node.durable = bytes(node.data)
            node.pending = []
        else:
            self.flush_data(node)
        if self.profile.meta_journal:
            self.commit_all_meta()

    def fsync_dir(self, node: Inode) -> None:
        if self.profile.meta_journal:
            self.commit_all_meta()
            return
        ino = node.ino
        keep: list[MetaOp] = []
        for op in self.meta_pending:
            edits = op.edits
            if len(edits) == 1:  # most changes edit one directory: no list to build
                if edits[0][0] == ino:
                    self._commit_meta(op)
                else:
                    keep.append(op)
                continue
            mine = [e for e in edits if e[0] == ino]
            if not mine:
                keep.append(op)
                continue
            self._commit_meta(op, mine)
            rest = tuple(e for e in op.edits if e[0] != ino)
            if rest:
                keep.append(MetaOp(op.gseq, op.kind, rest, None))
        self.meta_pending = keep

    def fail_fsync(self, node: Inode) -> None:
        """An fsync failed: the dirty pages are dropped unwritten but stay visible."""
        self.clock += 1
        if node.pending:
            self.dropped.append((node.ino, self.clock, tuple(node.pending)))
            node.pending = []
            node.diverged = True

    def sync_all(self) -> None:
        """Make everything durable, as a clean shutdown followed by sync(1) would."""
        for op in self.meta_pending:
            self._commit_meta(op)
        self.meta_pending = []
        for node in self.inodes.values():
            if not node.is_dir:
                self.flush_data(node)

    # ------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        """Assert the model's internal consistency (used by the self-tests)."""
        for node in self.inodes.values():
            if node.is_dir:
                for target in node.entries.values():
                    assert target in self.inodes, f"dangling entry to inode {target}"
            elif not node.diverged:
                replayed = apply_data_ops(node.durable, node.pending)
                assert replayed == bytes(node.data), f"inode {node.ino}: replay differs"
