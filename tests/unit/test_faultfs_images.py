"""Crash images per mode and profile, on the sequences behind the classic bugs."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from faultfs import FaultFS, Profile
from faultfs.errors import ConfigError

ROOT = "/faultfs-images"
Tree = dict[str, bytes | None]


def run(profile: str, steps: Callable[[FaultFS], None], block_size: int = 4096) -> FaultFS:
    fs = FaultFS(ROOT, profile, block_size=block_size)
    with fs:
        steps(fs)
    return fs


def trees(fs: FaultFS, mode: str, limit: int = 64) -> list[Tree]:
    return [img.tree() for img in fs.crash_images(mode, limit=limit)]


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def write(path: str, data: bytes, *, sync: bool = False, flags: int = os.O_TRUNC) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags)
    os.write(fd, data)
    if sync:
        os.fsync(fd)
    os.close(fd)


def durable_base(fs: FaultFS) -> None:
    write(fs.path("cfg"), b"old", sync=True)
    fsync_path(fs.root)


# ------------------------------------------------------------------ power


@pytest.mark.parametrize(
    ("profile", "expected"),
    [("posix", {}), ("ext4-ordered", {"f": b"data"}), ("lazyfs", {"f": b"data"})],
)
def test_created_and_fsynced_file_without_directory_fsync(profile: str, expected: Tree) -> None:
    fs = run(profile, lambda fs: write(fs.path("f"), b"data", sync=True))
    assert trees(fs, "power") == [expected]
    assert trees(fs, "process") == [{"f": b"data"}]


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("posix", {"cfg": b"old"}),
        # The temp file's fsync committed its creation, not the later rename.
        ("ext4-ordered", {"cfg": b"old", "cfg.tmp": b"new"}),
        ("lazyfs", {"cfg": b"new"}),
    ],
)
def test_replace_without_directory_fsync(profile: str, expected: Tree) -> None:
    def steps(fs: FaultFS) -> None:
        durable_base(fs)
        write(fs.path("cfg.tmp"), b"new", sync=True)
        os.replace(fs.path("cfg.tmp"), fs.path("cfg"))

    assert trees(run(profile, steps), "power") == [expected]


@pytest.mark.parametrize(
    ("profile", "expected"),
    [("posix", {"cfg": b""}), ("ext4-ordered", {"cfg": b"new"}), ("lazyfs", {"cfg": b""})],
)
def test_replace_without_file_fsync_then_directory_fsync(profile: str, expected: Tree) -> None:
    """The rename is durable; whether the data is depends on auto_da_alloc."""

    def steps(fs: FaultFS) -> None:
        durable_base(fs)
        write(fs.path("cfg.tmp"), b"new")
        os.replace(fs.path("cfg.tmp"), fs.path("cfg"))
        fsync_path(fs.root)

    assert trees(run(profile, steps), "power") == [expected]


def test_posix_directory_fsync_covers_only_its_own_entries() -> None:
    def steps(fs: FaultFS) -> None:
        os.mkdir(fs.path("d"))
        fsync_path(fs.root)
        write(fs.path("d", "f"), b"x", sync=True)
        write(fs.path("top"), b"y", sync=True)
        fsync_path(fs.path("d"))

    assert trees(run("posix", steps), "power") == [{"d": None, "d/f": b"x"}]


def test_new_directory_needs_its_parent_fsynced() -> None:
    def steps(fs: FaultFS) -> None:
        os.mkdir(fs.path("d"))
        write(fs.path("d", "f"), b"x", sync=True)
        fsync_path(fs.path("d"))

    assert trees(run("posix", steps), "power") == [{}]


def test_unlink_and_link_durability() -> None:
    def steps(fs: FaultFS) -> None:
        durable_base(fs)
        os.link(fs.path("cfg"), fs.path("alias"))
        fsync_path(fs.root)
        os.unlink(fs.path("cfg"))

    fs = run("posix", steps)
    assert trees(fs, "power") == [{"alias": b"old", "cfg": b"old"}]
    assert trees(fs, "process") == [{"alias": b"old"}]


# ------------------------------------------------------------------- torn


def torn_contents(
    profile: str, prior: bytes, payload: bytes, flags: int, block_size: int
) -> list[bytes]:
    """The torn images of one unsynced write of ``payload`` onto a durable file ``prior``."""

    def steps(fs: FaultFS) -> None:
        write(fs.path("f"), prior, sync=True)
        fsync_path(fs.root)
        write(fs.path("f"), payload, flags=flags)

    images = trees(run(profile, steps, block_size=block_size), "torn")
    contents = [tree["f"] for tree in images]
    assert all(c is not None for c in contents)
    assert len(set(contents)) == len(contents)  # distinct images only
    return [c for c in contents if c is not None]


Z = b"\0"
# Appending b"abcdefghi" to b"0123" with 4-byte blocks (cuts at bytes 8 and 12).
APPEND_EXT4 = {
    b"0123" + Z * 9,  # zeros: the size was committed, the blocks never converted
    b"0123abcd",  # prefix: the first block landed, the size covers it
    b"0123abcdefgh",
    b"0123abcd" + Z * 5,  # prefix-zeros
    b"0123abcdefgh" + Z,
    b"0123" + Z * 4 + b"efghi",  # suffix: a later block landed first
    b"0123" + Z * 8 + b"i",
}
APPEND_LAZYFS = {  # torn-op parts=3, each 3 bytes: every proper subset persisted
    b"0123abc",
    b"0123" + Z * 3 + b"def",
    b"0123" + Z * 6 + b"ghi",
    b"0123abcdef",
    b"0123abc" + Z * 3 + b"ghi",
    b"0123" + Z * 3 + b"defghi",
}


@pytest.mark.parametrize(
    ("profile", "expected"),
    [("ext4-ordered", APPEND_EXT4), ("lazyfs", APPEND_LAZYFS)],
)
def test_torn_append_leaves_exactly_the_profiles_shapes(profile: str, expected: set[bytes]) -> None:
    got = torn_contents(profile, b"0123", b"abcdefghi", os.O_APPEND, block_size=4)
    assert set(got) == expected


def test_posix_torn_append_allows_every_shape_plus_garbage() -> None:
    got = set(torn_contents("posix", b"0123", b"abcdefghi", os.O_APPEND, block_size=4))
    garbage = got - APPEND_EXT4 - APPEND_LAZYFS
    assert got >= APPEND_EXT4 | APPEND_LAZYFS
    (stale,) = garbage  # exactly one more: the extension holding stale bytes
    assert stale[:4] == b"0123" and len(stale) == 13 and stale[4:] != b"abcdefghi"


def test_torn_overwrite_in_place_keeps_old_bytes_where_nothing_landed() -> None:
    def got(profile: str) -> set[bytes]:
        return set(torn_contents(profile, b"a" * 8, b"b" * 8, 0, block_size=4))

    ext4 = {b"bbbbaaaa", b"aaaabbbb"}  # one of the two blocks landed; no extension
    # parts of 2 bytes, the remainder (2) joins the last persisted part
    lazyfs = {b"bbbbaaaa", b"aabbbbaa", b"aaaabbbb", b"bbbbbbaa", b"bbaabbbb", b"aabbbbbb"}
    assert got("ext4-ordered") == ext4
    assert got("lazyfs") == lazyfs
    assert got("posix") == ext4 | lazyfs


def test_a_small_append_is_never_torn_into_a_prefix_at_4096_on_ext4() -> None:
    record = b"rec1\n"
    ext4 = torn_contents("ext4-ordered", b"rec0\n", record, os.O_APPEND, block_size=4096)
    assert ext4 == [b"rec0\n" + Z * 5]  # the whole block or nothing: zeros at worst
    lazyfs = set(torn_contents("lazyfs", b"rec0\n", record, os.O_APPEND, block_size=4096))
    # LazyFS splits by bytes, whatever the block size: a prefix is possible there.
    assert b"rec0\nrec" in lazyfs and b"rec0\nrec1" in lazyfs
    posix = set(torn_contents("posix", b"rec0\n", record, os.O_APPEND, block_size=4096))
    assert set(ext4) | lazyfs < posix and len(posix) == len(lazyfs) + 2  # + zeros, garbage


def test_unknown_torn_shape_is_refused() -> None:
    with pytest.raises(ConfigError, match="torn shapes"):
        Profile("mine", False, False, False, torn_shapes=frozenset(("confetti",)))


def test_torn_image_of_a_fully_synced_state_is_the_power_image() -> None:
    fs = run("posix", durable_base)
    images = list(fs.crash_images("torn"))
    assert [img.tree() for img in images] == [{"cfg": b"old"}]
    assert images[0].origin is not None and "power image" in images[0].origin.detail


# ---------------------------------------------------------------- reorder


def unsynced_pair(fs: FaultFS) -> None:
    durable_base(fs)
    write(fs.path("a"), b"A")
    write(fs.path("b"), b"B")


def test_posix_reorder_keeps_any_subset() -> None:
    images = trees(run("posix", unsynced_pair), "reorder")
    # Each entry and each file's data may be lost independently.
    assert {"cfg": b"old", "b": b"B"} in images
    assert {"cfg": b"old", "a": b""} in images
    assert {"cfg": b"old", "a": b"A", "b": b"B"} in images
    assert images[0] == {"cfg": b"old"}  # the empty subset (power) comes first


def test_ext4_reorder_keeps_namespace_changes_in_order() -> None:
    images = trees(run("ext4-ordered", unsynced_pair), "reorder")
    assert all(not ("b" in tree and "a" not in tree) for tree in images)
    assert {"cfg": b"old", "a": b"", "b": b""} in images


def test_lazyfs_reorder_only_varies_data() -> None:
    images = trees(run("lazyfs", unsynced_pair), "reorder")
    assert all({"a", "b"} <= set(tree) for tree in images)
    assert {"cfg": b"old", "a": b"A", "b": b""} in images


def test_ext4_reorder_never_keeps_a_replace_without_the_data_it_replaced_with() -> None:
    def steps(fs: FaultFS) -> None:
        durable_base(fs)
        write(fs.path("cfg.tmp"), b"new")
        os.replace(fs.path("cfg.tmp"), fs.path("cfg"))

    for tree in trees(run("ext4-ordered", steps), "reorder"):
        assert tree.get("cfg") in (b"old", b"new")
    assert {"cfg": b""} in trees(run("posix", steps), "reorder")


# ------------------------------------------------------- enumeration API


def test_limit_seed_index_and_dedupe() -> None:
    def steps(fs: FaultFS) -> None:
        durable_base(fs)
        for i in range(14):  # past exhaustive enumeration: seeded subsets
            write(fs.path(f"f{i}"), b"x")

    fs = run("posix", steps)
    images = list(fs.crash_images("reorder", limit=20, seed=5))
    assert len(images) == 20
    assert len({tuple(sorted(img.tree().items())) for img in images}) == 20
    again = [img.tree() for img in fs.crash_images("reorder", limit=20, seed=5)]
    assert again == [img.tree() for img in images]
    assert fs.crash_image("reorder", seed=5, index=7).tree() == images[7].tree()
    assert fs.crash_image("reorder", seed=3).tree() == fs.crash_image("reorder", seed=3).tree()
    with pytest.raises(ConfigError, match="mode"):
        fs.crash_image("meteor")


def test_images_are_independent_of_each_other_and_of_the_source() -> None:
    fs = run("posix", durable_base)
    image = fs.crash_image("power")
    with image:
        write(image.path("cfg"), b"changed", sync=True)
    assert fs.tree() == {"cfg": b"old"}
    assert fs.crash_image("power").tree() == {"cfg": b"old"}
    # Rewriting an existing file needs only its own fsync to be durable.
    assert image.tree(durable=True) == {"cfg": b"changed"}


def test_image_state_is_fully_durable_and_carries_acks() -> None:
    def steps(fs: FaultFS) -> None:
        write(fs.path("f"), b"x")
        fs.ack("first")

    fs = run("posix", steps)
    image = fs.crash_image("process")
    assert image.acked == ["first"]
    assert image.tree(durable=True) == image.tree() == {"f": b"x"}
    assert image.origin is not None and image.origin.phase == "now"


def test_snapshot_round_trip_is_copy_on_write() -> None:
    fs = run("posix", durable_base)
    snap = fs.snapshot()
    with fs:
        write(fs.path("cfg"), b"later")
    copy = FaultFS.from_snapshot(snap)
    assert copy.tree() == {"cfg": b"old"} and fs.tree() == {"cfg": b"later"}
    with copy:
        write(copy.path("other"), b"o")
    assert FaultFS.from_snapshot(snap).tree() == {"cfg": b"old"}


def test_an_abandoned_enumeration_does_not_lock_the_file_system() -> None:
    fs = run("posix", unsynced_pair)
    first = next(fs.crash_images("reorder"))
    assert first.tree() == {"cfg": b"old"}
    seen: list[bool] = []
    worker = threading.Thread(target=lambda: seen.append(fs.snapshot() is not None))
    worker.start()
    worker.join(timeout=5)
    assert seen == [True]


@pytest.mark.parametrize("profile", ["posix", "ext4-ordered", "lazyfs"])
def test_a_sampled_torn_image_is_the_seeds_pick_of_every_torn_choice(profile: str) -> None:
    """``crash_image("torn", seed)`` builds only the candidate it picks; the pick, its
    bytes (garbage included) and its description are those of choosing among the
    fully built choices, as it always chose."""
    import itertools
    import random

    from faultfs._fs import MAX_TORN_SAMPLE_POOL
    from faultfs._images import durable_image, fingerprint, torn_choices

    def steps(fs: FaultFS) -> None:
        durable_base(fs)
        write(fs.path("log"), b"0123", sync=True)
        fsync_path(fs.root)
        write(fs.path("log"), b"abcdefghi", flags=os.O_APPEND)
        write(fs.path("log"), b"jklmnopqrstu", flags=os.O_APPEND)
        write(fs.path("cfg"), b"newer and longer")

    fs = run(profile, steps, block_size=4)
    for seed in range(12):
        pool = list(itertools.islice(torn_choices(fs.model, 4, seed), MAX_TORN_SAMPLE_POOL))
        assert len(pool) > 3
        want = random.Random(seed).choice(pool)
        image = fs.crash_image("torn", seed=seed)
        assert image.origin is not None and image.origin.detail == want.detail
        assert fingerprint(image.model) == fingerprint(durable_image(fs.model, want))


# ------------------------------------------------------------------ details


def rename_then_write(fs: FaultFS) -> None:
    durable_base(fs)
    write(fs.path("cfg.tmp"), b"new")
    os.rename(fs.path("cfg.tmp"), fs.path("cfg.next"))
    os.mkdir(fs.path("sub"))
    write(fs.path("sub/log"), b"L")
    write(fs.path("gone"), b"G")
    os.unlink(fs.path("gone"))


def test_an_image_detail_names_renames_and_files_as_a_reader_does() -> None:
    fs = run("posix", rename_then_write)
    details = [img.origin.detail for img in fs.crash_images("reorder", limit=1 << 10)]
    everything = max(details, key=len)  # the image that kept every unsynced operation
    assert "rename cfg.tmp -> cfg.next" in everything
    # Data by inode, with the file's name at the crash: cfg.tmp was renamed after its write.
    assert "write off=0 len=3 (inode " in everything
    assert ", cfg.next at the crash)" in everything
    assert "create sub/log;" in everything and ", sub/log at the crash)" in everything
    assert ", unlinked)" in everything  # gone's write, its name removed since
    assert "(removed)" not in everything and "cfg.tmp at the crash" not in everything
