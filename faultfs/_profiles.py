"""File-system profiles: which unsynced changes a crash may keep, and in what order."""

from __future__ import annotations

from dataclasses import dataclass

from faultfs.errors import ConfigError


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


POSIX = Profile("posix", meta_immediate=False, meta_journal=False, replace_flushes_data=False)
EXT4_ORDERED = Profile(
    "ext4-ordered", meta_immediate=False, meta_journal=True, replace_flushes_data=True
)
LAZYFS = Profile("lazyfs", meta_immediate=True, meta_journal=False, replace_flushes_data=False)

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
