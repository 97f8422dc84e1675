"""FaultFS: the user-facing object (activation, crash counter, faults, images, snapshots)."""

from __future__ import annotations

import errno as errno_mod
import itertools
import os
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from faultfs import _buffered, _capture, _escapes, _intercept, _realdisk, _swallowed
from faultfs._arguments import checked
from faultfs._images import (
    MODES,
    Fingerprint,
    ImageChoice,
    build,
    durable_image,
    durable_reach,
    fingerprint,
    process_image,
    reached_fingerprint,
    reorder_choices,
    sample_reorder,
    torn_candidates,
    torn_choices,
)
from faultfs._model import Model
from faultfs._process_model import ProcessModel
from faultfs._profiles import get_profile
from faultfs._syscalls import Syscalls
from faultfs._trace import Frame, Op, call_stack
from faultfs.errors import ConfigError

DEFAULT_IMAGE_LIMIT = 64
DEFAULT_BLOCK_SIZE = 4096
# crash_images gives up after this many candidates per image it still owes:
# many subsets of unsynced operations collapse to the same tree.
CANDIDATES_PER_IMAGE = 8
# crash_image(mode, seed) picks among at most this many torn variants.
MAX_TORN_SAMPLE_POOL = 256
OUTSIDE_POLICIES = ("passthrough", "refuse")
# How many calls outside the root a FaultFS describes (it counts them all).
OUTSIDE_EXAMPLES_KEPT = 5
_BELOW_KEPT = 4096
"""Paths a FaultFS keeps the normalised form of for read_file and read_tree (see _below)."""


@dataclass(frozen=True)
class ImageOrigin:
    """Where a crash image comes from: the crash point and the image's place in its mode."""

    boundary: int | None  # None when the image was taken without a crash
    phase: str  # "before" or "after" the operation, or "now"
    op: Op | None
    mode: str
    index: int | None  # position in crash_images(mode, seed=seed); None when sampled
    seed: int
    detail: str
    # Which unsynced changes the image kept (cause analysis starts from it).
    choice: ImageChoice | None = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> str:
        """Reproduction key: boundary, mode and image (index or seed)."""
        image = f"#{self.index}" if self.index is not None else "sampled"
        return f"boundary={self.boundary} mode={self.mode} image={image} seed={self.seed}"


@dataclass(frozen=True)
class Snapshot:
    """A frozen copy of a FaultFS's disk and cache state (no descriptors, no counter)."""

    root: str
    profile: str
    outside: str
    block_size: int
    model: Model
    acked: tuple[Any, ...]


def _check_root(root: Any) -> str:
    path = os.fspath(root)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not path.startswith("/"):
        raise ConfigError(f"root must be an absolute path, got {path!r}")
    path = os.path.normpath(path)
    if path in ("/", "//"):
        raise ConfigError("root must not be '/': choose a directory to simulate")
    return path


class FaultFS(Syscalls):
    """A simulated file system mounted at ``root`` that can crash at any boundary.

    ``with fs:`` routes os/io/pathlib/shutil calls on paths under ``root`` to
    the model. ``arm(n)`` crashes at the n-th boundary from now (each mutating
    call has one boundary before and one after it). After a crash,
    ``crash_image(mode)`` returns a new FaultFS holding what the disk would
    show; recovery runs on that.

    ``profile`` names the file system whose crash behaviour is modelled
    (``posix``, ``ext4-ordered``, ``lazyfs``). ``outside`` says what happens
    to paths outside ``root`` while active. ``block_size`` (bytes, default
    4096) is the unit in which the torn mode lands a write on the block-based
    profiles (posix, ext4-ordered): a write is cut only at multiples of it, so
    at 4096 a small append inside one block is never torn into a partial
    prefix there (it can still land as zeros, or as garbage on posix); use 512
    to model a disk that only guarantees sector atomicity. LazyFS splits
    writes by bytes, whatever the block size. ``record_trace`` keeps ``trace``
    and the issuing frames (needed for cause analysis). ``durable_state=False``
    keeps only what the process sees (``_process_model``): cheaper calls, and
    process crash images only (power, torn and reorder ones raise ConfigError).
    """

    @checked
    def __init__(
        self,
        root: str | os.PathLike[str],
        profile: str = "posix",
        outside: str = "passthrough",
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        record_trace: bool = True,
        durable_state: bool = True,
    ) -> None:
        if outside not in OUTSIDE_POLICIES:
            raise ConfigError(f"outside must be one of {OUTSIDE_POLICIES}, got {outside!r}")
        if not isinstance(block_size, int) or block_size <= 0:
            raise ConfigError(f"block_size must be a positive number of bytes, got {block_size!r}")
        model = (Model if durable_state else ProcessModel)(get_profile(profile))
        super().__init__(_check_root(root), model, record_trace)
        self.outside = outside
        self.block_size = block_size
        self.acked: list[Any] = []
        # Where each acknowledgement happened: (model clock, issuing frames).
        self.ack_marks: list[tuple[int, tuple[Frame, ...]]] = []
        # (index into ack_marks, files whose Python file object still held data then).
        self.ack_buffered: list[tuple[int, tuple[str, ...]]] = []
        self.origin: ImageOrigin | None = None
        # What the health checks read: calls routed here, calls outside the root
        # (counted when refused, or when watch_outside is set), escapes stopped.
        self.touches = 0
        self.watch_outside = False
        self.outside_calls = 0
        self.outside_examples: list[str] = []
        self.escapes: list[str] = []
        # Real descriptors open for writing under the root before the first activation
        # (None: not looked for yet), and their state at the latest activation.
        self._preopened: dict[int, str] | None = None
        self._preopened_marks: dict[int, tuple[int, int, int, int] | None] = {}
        # A plain FaultFS's real tree under the root at its activation (see _realdisk.note_tree).
        self._real_tree: _realdisk.State | None = None
        # What capture_at keeps, and whom it tells.
        self._captured: list[FaultFS] = []
        self._on_capture: Callable[[FaultFS], None] | None = None
        # content_fingerprint() as an image's search found it: (model, its clock then, value).
        self._content: tuple[Model, int, Fingerprint] | None = None
        self._below_root: dict[str, str] = {}  # see _below

    @property
    def profile(self) -> str:
        return self.model.profile.name

    def __repr__(self) -> str:
        origin = self.origin
        if origin is not None:
            # A crash image: which one says more than its root (reports show paths under
            # the root relative to it) or the boundaries its check passed.
            dead = ", crashed" if self.crashed else ""
            return (
                f"<FaultFS crash image {origin.key} ({origin.detail}) profile={self.profile}{dead}>"
            )
        state = "crashed" if self.crashed else f"{self.boundaries} boundaries"
        return f"<FaultFS root={self.root!r} profile={self.profile} {state}>"

    def path(self, *parts: str) -> str:
        """An absolute path under the root (``fs.path("a", "b.json")``)."""
        return os.path.join(self.root, *parts)

    def _inside(self, path: str | os.PathLike[str]) -> str:
        p = _check_root(path)
        if p != self.root and not p.startswith(self._root_slash):
            raise ConfigError(f"{p!r} is not under this FaultFS's root {self.root!r}")
        return p

    def _below(self, relpath: str) -> str:
        """``_inside(path(relpath))``, kept: checks read the same trees after every step."""
        p = self._below_root.get(relpath)
        if p is None:
            p = self._inside(self.path(relpath))
            if len(self._below_root) >= _BELOW_KEPT:
                self._below_root.clear()
            self._below_root[relpath] = p
        return p

    # ------------------------------------------------------------- activation

    def __enter__(self) -> FaultFS:
        _realdisk.note_preopened(self)
        _realdisk.note_tree(self)
        _intercept.activate(self)
        return self

    def __exit__(self, exc_type: object = None, exc: object = None, tb: Any = None) -> None:
        """Deactivate, first finalizing what the run left behind while the model is active.

        A crashed run's frames are cleared and its garbage collected: a real
        kill runs no finalizers, and here those that do run meet the dead
        process (their I/O is refused silently) instead of the real disk.
        """
        try:
            if self.crashed or len(_intercept.active()) == 1:
                _escapes.bury(tb if self.crashed else None)
        finally:
            _intercept.deactivate(self)
        _realdisk.check_preopened(self)
        _realdisk.check_tree(self)

    def note_outside(self, what: str) -> None:
        """Count a call on a path outside the root (kept for the outside_root health check)."""
        self.outside_calls += 1
        if len(self.outside_examples) < OUTSIDE_EXAMPLES_KEPT:
            self.outside_examples.append(what)

    @property
    def active(self) -> bool:
        return self in _intercept.active()

    # ---------------------------------------------------------- crash counter

    def arm(self, n: int) -> None:
        """Crash at the ``n``-th boundary from now (1-based)."""
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"arm(n) needs n >= 1 (boundaries from now), got {n!r}")
        if self.crashed:
            raise ConfigError("this FaultFS already crashed; arm a crash image instead")
        self._crash_at = self.boundaries + n
        self._plan_stops()

    def disarm(self) -> None:
        """Take back an armed crash (a capture plan stays: see capture_at)."""
        self._crash_at = None
        self._plan_stops()

    @checked
    def capture_at(
        self,
        boundaries: Iterable[int],
        on_capture: Callable[[FaultFS], None] | None = None,
    ) -> list[FaultFS]:
        """Keep what a crash at each of ``boundaries`` would leave, without stopping the run.

        ``boundaries`` count from now, as ``arm(n)`` does (1 is the next one).
        At each, a crashed copy of this FaultFS is appended to the returned
        list (in boundary order) and handed to ``on_capture``: the copy a run
        armed there would have left, with the same ``crash_point``, ``trace``,
        ``acked`` and disk, so its ``crash_images``/``crash_image`` give exactly
        the images of that crash, in every mode. The run itself goes on
        unchanged: capturing passes no boundary. One run then yields the crash
        states of many boundaries instead of one run per boundary.

        ``on_capture(copy)`` runs at that boundary, while the program is
        stopped inside the operation, so a caller can keep its own state of the
        moment beside the copy; it must do no I/O under this root (that would
        pass boundaries: ConfigError), and what it raises reaches the program.
        A boundary the run never reaches leaves no entry; an armed crash at a
        captured boundary is captured first. A new call replaces the plan
        (``capture_at(())`` stops capturing). Each copy holds a copy of the
        model's inodes (contents are shared until written), so capture the
        boundaries you will check, not all of a long run.
        """
        if self.crashed:
            raise ConfigError("this FaultFS already crashed; capture on a crash image instead")
        self._capture_plan = _capture.plan(self.boundaries, boundaries)
        self._captured = []
        self._on_capture = on_capture
        self._plan_stops()
        return self._captured

    def _capture(self, phase: str, op: Op) -> None:
        copy = _capture.crashed_copy(self, phase, op)
        self._captured.append(copy)
        if self._on_capture is not None:
            at = self.boundaries
            self._on_capture(copy)
            if self.boundaries != at:
                raise ConfigError(
                    f"on_capture passed {self.boundaries - at} boundaries of the FaultFS it "
                    "watches: it must not do I/O under the root (use the copy it is handed)"
                )

    @property
    def armed(self) -> bool:
        return self._crash_at is not None

    def ack(self, item: Any) -> None:
        """Record that the program acknowledged ``item``; images carry the list along.

        After a crash the process is dead: CrashSwallowed (the code under test caught
        SimulatedCrash and went on).
        """
        if self.crashed:
            raise _swallowed.refuse_ack(self, f"the acknowledgement {item!r}")
        self.acked.append(item)
        stack = call_stack(2)[0] if self._record_trace else ()
        self.ack_marks.append((self.model.clock, stack))
        held = _buffered.unflushed(self) if self._record_trace else ()
        if held:
            self.ack_buffered.append((len(self.ack_marks) - 1, held))

    # ------------------------------------------------------------------ faults

    @checked
    def fail_next_fsync(
        self, path: str | os.PathLike[str] | None = None, errno: int = errno_mod.EIO
    ) -> None:
        """Make the next fsync (of ``path``'s inode, or of anything) fail with ``errno``.

        As on Linux, the failed fsync drops the file's dirty pages unwritten and
        counts them clean: the process still reads the new data, but a later
        fsync does not write it, and a power loss loses it.
        """
        ino = None
        if path is not None:
            with self._lock:
                ino = self._existing(self._inside(path)).ino
        self._fsync_faults.append((ino, errno))

    @checked
    def fail_writes_with(
        self,
        errno: int | None = errno_mod.ENOSPC,
        after_bytes: int = 0,
        path: str | os.PathLike[str] | None = None,
    ) -> None:
        """After ``after_bytes`` more bytes, writes fail with ``errno`` (None clears).

        The write that crosses the limit is short: it writes what fits, as a
        nearly full disk does.
        """
        if after_bytes < 0:
            raise ConfigError(f"after_bytes must be >= 0, got {after_bytes}")
        ino = None
        if path is not None and errno is not None:
            with self._lock:
                ino = self._existing(self._inside(path)).ino
        self._write_errno = errno
        self._write_budget = after_bytes
        self._write_fault_ino = ino

    def short_writes(self, max_bytes: int | None) -> None:
        """Every write accepts at most ``max_bytes`` bytes and reports the count (None clears)."""
        if max_bytes is not None and max_bytes < 1:
            raise ConfigError(f"max_bytes must be >= 1 or None, got {max_bytes}")
        self._short_write_max = max_bytes

    def clear_faults(self) -> None:
        self._fsync_faults.clear()
        self._write_errno = None
        self._short_write_max = None

    # ------------------------------------------------------------------ images

    def _spawn(
        self,
        model: Model,
        mode: str,
        index: int | None,
        seed: int,
        detail: str,
        choice: ImageChoice | None = None,
        content: Fingerprint | None = None,
    ) -> FaultFS:
        image = FaultFS(
            self.root,
            model.profile.name,
            self.outside,
            block_size=self.block_size,
            record_trace=self._record_trace,
        )
        image.model = model
        if content is not None:
            image._content = (model, model.clock, content)
        image.acked = list(self.acked)
        image.ack_marks = list(self.ack_marks)
        image.ack_buffered = list(self.ack_buffered)
        image.watch_outside = self.watch_outside
        image._preopened = self._preopened
        if self.crash_point is not None:
            boundary, phase, op = self.crash_point
            image.origin = ImageOrigin(boundary, phase, op, mode, index, seed, detail, choice)
        else:
            image.origin = ImageOrigin(None, "now", None, mode, index, seed, detail, choice)
        return image

    @checked
    def crash_images(
        self, mode: str, limit: int = DEFAULT_IMAGE_LIMIT, seed: int = 0
    ) -> Iterator[FaultFS]:
        """Every distinct image of this crash point in ``mode``, at most ``limit`` of them.

        process and power have exactly one image. torn and reorder enumerate
        their variants in a fixed order (seeded where the space is too large);
        when nothing unsynced can be torn or reordered, their one image is the
        power image.
        """
        if mode not in MODES:
            raise ConfigError(f"unknown crash mode {mode!r}; choose one of {MODES}")
        if limit < 1:
            raise ConfigError(f"limit must be >= 1, got {limit}")
        # Built under the lock, handed out after: a consumer that stops early
        # must not leave the file system locked.
        with self._lock:
            found = self._image_models(mode, limit, seed)
        for model, index, choice, print_ in found:
            yield self._spawn(model, mode, index, seed, choice.detail, choice, print_)

    def _image_models(
        self, mode: str, limit: int, seed: int
    ) -> list[tuple[Model, int, ImageChoice, Fingerprint | None]]:
        if mode == "process":
            return [
                (
                    process_image(self.model),
                    0,
                    ImageChoice(everything=True, detail="page cache kept"),
                    None,
                )
            ]
        if mode == "power":
            power = durable_image(self.model, ImageChoice())
            return [(power, 0, ImageChoice(detail="durable state only"), None)]
        if mode == "torn":
            choices = torn_choices(self.model, self.block_size, seed)
            # a tear that left the file as it was durably is the power image, not torn
            seen = {reached_fingerprint(durable_reach(self.model, ImageChoice()))}
        else:
            choices = reorder_choices(self.model, seed)
            seen = set()
        seen_choices: set[ImageChoice] = set()
        found: list[tuple[Model, int, ImageChoice, Fingerprint | None]] = []
        for choice in itertools.islice(choices, limit * CANDIDATES_PER_IMAGE):
            if choice in seen_choices:
                continue
            seen_choices.add(choice)
            reached = durable_reach(self.model, choice)
            print_ = reached_fingerprint(reached)
            if print_ in seen:
                continue  # not built: an image with this content is already found
            seen.add(print_)
            found.append((build(self.model, reached), len(found), choice, print_))
            if len(found) >= limit:
                break
        if found:
            return found
        power = durable_image(self.model, ImageChoice())
        return [(power, 0, ImageChoice(detail=f"nothing unsynced to {mode}: power image"), None)]

    @checked
    def crash_image(self, mode: str, seed: int = 0, index: int | None = None) -> FaultFS:
        """The ``index``-th image of crash_images(mode, seed=seed), else one sampled by seed."""
        if index is not None:
            if index < 0:
                raise ConfigError(f"index must be >= 0, got {index}")
            for image in self.crash_images(mode, limit=index + 1, seed=seed):
                if image.origin is not None and image.origin.index == index:
                    return image
            raise ConfigError(f"crash point has fewer than {index + 1} {mode} images")
        if mode in ("process", "power"):
            return next(self.crash_images(mode, seed=seed))
        if mode not in MODES:
            raise ConfigError(f"unknown crash mode {mode!r}; choose one of {MODES}")
        with self._lock:
            if mode == "reorder":
                choice = sample_reorder(self.model, seed)
            else:
                pool = list(
                    itertools.islice(
                        torn_candidates(self.model, self.block_size, seed), MAX_TORN_SAMPLE_POOL
                    )
                )  # the one chosen is built, not all of them
                choice = random.Random(seed).choice(pool).choice() if pool else ImageChoice()
            model = durable_image(self.model, choice)
        return self._spawn(model, mode, None, seed, choice.detail or "power image", choice)

    # --------------------------------------------------------------- snapshots

    def snapshot(self) -> Snapshot:
        """A cheap frozen copy (file contents are shared until either side writes)."""
        with self._lock:
            return Snapshot(
                self.root,
                self.profile,
                self.outside,
                self.block_size,
                self.model.clone(),
                tuple(self.acked),
            )

    @classmethod
    @checked
    def from_snapshot(cls, snap: Snapshot, *, record_trace: bool = True) -> FaultFS:
        """A fresh, unarmed FaultFS (no open descriptors) in the snapshot's state."""
        fs = cls(
            snap.root,
            snap.profile,
            snap.outside,
            block_size=snap.block_size,
            record_trace=record_trace,
        )
        fs.model = snap.model.clone()
        fs.acked = list(snap.acked)
        fs.ack_marks = [(0, ())] * len(snap.acked)
        return fs

    def sync_all(self) -> None:
        """Make every change durable, as a clean shutdown and sync(1) would."""
        with self._lock:
            self.model.sync_all()

    # ----------------------------------------------------------------- viewing

    @checked
    def tree(self, durable: bool = False) -> dict[str, bytes | None]:
        """Relative path -> file bytes (None for a directory) of the visible or durable tree."""
        self.touches += 1
        with self._lock:
            if durable:
                content = fingerprint(durable_image(self.model, ImageChoice()))
            else:
                content = self._visible_content()
            return {path.lstrip("/").rstrip("/"): data for path, data in content if path != "/"}

    def content_fingerprint(self) -> Fingerprint:
        """The visible tree as a value: every path (a directory's ending in ``/``, the
        root's ``/``) with its bytes (None for a directory), sorted by path.

        Equal for two file systems exactly when their visible trees hold the same
        names and bytes (modes and times aside): a key for crash states that must
        get the same verdict. A crash image nothing has changed since it was made
        has it already (the torn and reorder searches compare images by it).
        """
        self.touches += 1
        with self._lock:
            return self._visible_content()

    def _visible_content(self) -> Fingerprint:
        known = self._content
        model = self.model
        # Every change of names or bytes moves the model's clock; a restore swaps the model.
        if known is not None and known[0] is model and known[1] == model.clock:
            return known[2]
        return fingerprint(model)

    def read_file(self, relpath: str) -> bytes:
        """The visible bytes of a file, read without interception (for assertions)."""
        self.touches += 1
        with self._lock:
            node = self._existing(self._below(relpath))
            if node.is_dir:
                raise IsADirectoryError(relpath)
            return bytes(node.data)

    def read_tree(self, relpath: str = "") -> dict[str, bytes | None]:
        """Every visible entry below a directory, read without interception.

        Path relative to ``relpath`` -> the file's bytes (None for a directory);
        empty when ``relpath`` does not exist. Cheap enough to call after every
        step: an oracle can tell from it whether anything it derived from those
        files needs deriving again.
        """
        self.touches += 1
        with self._lock:
            inodes = self.model.inodes
            try:
                top = self._existing(self._below(relpath))
            except FileNotFoundError:
                return {}
            if not top.is_dir:
                raise NotADirectoryError(relpath)
            out: dict[str, bytes | None] = {}
            stack = [("", top)]
            while stack:
                prefix, node = stack.pop()
                for name, ino in node.entries.items():
                    child = inodes[ino]
                    path = prefix + name
                    if child.is_dir:
                        out[path] = None
                        stack.append((path + "/", child))
                    else:
                        out[path] = bytes(child.data)
            return out
