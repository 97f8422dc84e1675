"""File-system profiles: which unsynced changes a crash may keep, and in what order."""

from __future__ import annotations

from dataclasses import dataclass, field

from faultfs.errors import ConfigError

# The ways one unsynced write can be half-done on the disk after a crash (see
# docs/faultfs.md, "Torn writes", for which file system leaves which):
#   zeros         the file's size covers the write, its new range reads zeros
#   garbage       the same, but the new range holds stale bytes
#   prefix        the first blocks landed (an extension ends after them)
#   prefix-zeros  the first blocks landed, the rest of the extension reads zeros
#   suffix        the blocks after a cut landed, the ones before did not
#   parts         LazyFS torn-op: the write split into three equal parts (the
#                 remainder joins the last persisted part), any of them landed
TORN_SHAPES = ("zeros", "garbage", "prefix", "prefix-zeros", "suffix", "parts")


@dataclass(frozen=True)
class Profile:
    """How namespace changes and data reach the disk on one kind of file system.

    Data (file contents and sizes) is always durable only once the file is
    fsynced (or, with ``replace_flushes_data``, once a replace that needs it
    is durable). The flags below describe namespace changes (create, link,
    rename, unlink, mkdir, rmdir).
    """

    name: str
    # Namespace changes are durable as soon as they return (LazyFS forwards
    # them to the backing file system and only caches data).
    meta_immediate: bool
    # Namespace changes form one journal: they persist in program order, and
    # any fsync, of a file or a directory, commits every earlier change.
    meta_journal: bool
    # Renaming over an existing file forces the source's data out first, as
    # ext4's auto_da_alloc heuristic does.
    replace_flushes_data: bool
    # The torn shapes (TORN_SHAPES) a crash may leave of one unsynced write.
    torn_shapes: frozenset[str] = field(default=frozenset(TORN_SHAPES))
    # sync(2) makes every file and directory durable before it returns (Linux waits
    # for the writeback and the journals). Under LazyFS it does not: the kernel's
    # sync sends a FUSE server no fsync (FUSE_SYNCFS only reaches servers that
    # implement it, and LazyFS does not), so its cache keeps the unsynced data.
    sync_persists: bool = True

    def __post_init__(self) -> None:
        unknown = set(self.torn_shapes) - set(TORN_SHAPES)
        if unknown:
            raise ConfigError(f"unknown torn shapes {sorted(unknown)}; choose from {TORN_SHAPES}")


# POSIX promises nothing about a crash: the strict profile allows every shape
# any modelled file system leaves, so code that passes it passes them all.
POSIX = Profile("posix", meta_immediate=False, meta_journal=False, replace_flushes_data=False)
# data=ordered writes data blocks before the metadata that exposes them, so an
# extension never shows stale blocks; with unwritten extents (dioread_nolock,
# the default since Linux 5.6) the size can be committed before the blocks are
# converted, which reads as zeros. Whole blocks only.
EXT4_ORDERED = Profile(
    "ext4-ordered",
    meta_immediate=False,
    meta_journal=True,
    replace_flushes_data=True,
    torn_shapes=frozenset(("zeros", "prefix", "prefix-zeros", "suffix")),
)
# LazyFS persists the chosen parts of a torn write with pwrite on the backing
# file (lazyfs.cpp, split_write): real bytes or holes, never garbage, at byte
# granularity.
LAZYFS = Profile(
    "lazyfs",
    meta_immediate=True,
    meta_journal=False,
    replace_flushes_data=False,
    torn_shapes=frozenset(("parts",)),
    sync_persists=False,
)

PROFILES: dict[str, Profile] = {p.name: p for p in (POSIX, EXT4_ORDERED, LAZYFS)}


def get_profile(name: str | Profile) -> Profile:
    """Look a profile up by name; a Profile instance is returned unchanged."""
    if isinstance(name, Profile):
        return name
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"unknown file-system profile {name!r}; choose one of {sorted(PROFILES)}"
        ) from None
