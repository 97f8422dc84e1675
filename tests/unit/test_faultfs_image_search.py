"""The torn and reorder searches build only new images, and images know their content.

``crash_images`` compares candidate images by content before building them
(``faultfs._images.durable_reach``); these tests hold it to the plain search
that builds every candidate and compares the built models, on random histories
of writes, renames, links and fsyncs in every profile.
"""

from __future__ import annotations

import itertools
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from faultfs import FaultFS
from faultfs._fs import CANDIDATES_PER_IMAGE
from faultfs._images import (
    ImageChoice,
    build,
    durable_image,
    durable_reach,
    fingerprint,
    reached_fingerprint,
    reorder_choices,
    torn_choices,
)
from faultfs._model import ROOT_INO, Inode, Model, apply_data_ops

ROOT = "/faultfs-image-search"
NAMES = ("a", "b", "d/c", "d/e")
LIMIT = 6

Op = tuple[str, int, int, bytes]
ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["write", "append", "fsync", "fsync_dir", "rename", "link", "unlink", "mkdir", "mvdir"]
        ),
        st.integers(0, len(NAMES) - 1),
        st.integers(0, len(NAMES) - 1),
        st.binary(min_size=1, max_size=6000),
    ),
    min_size=1,
    max_size=12,
)


def _apply(fs: FaultFS, op: Op) -> None:
    kind, i, j, payload = op
    src, dst = fs.path(NAMES[i]), fs.path(NAMES[j])
    try:
        if kind in ("write", "append"):
            flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if kind == "append" else os.O_TRUNC)
            fd = os.open(src, flags)
            os.write(fd, payload)
            os.close(fd)
        elif kind == "fsync":
            fd = os.open(src, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        elif kind == "fsync_dir":
            fd = os.open(os.path.dirname(src), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        elif kind == "rename":
            os.rename(src, dst)
        elif kind == "link":
            os.link(src, dst)
        elif kind == "unlink":
            os.unlink(src)
        elif kind == "mkdir":
            os.mkdir(fs.path("d"))
        else:  # a directory renamed back and forth: the torn renames' double reach
            os.rename(fs.path("d"), fs.path("d2"))
            os.mkdir(fs.path("d"))
            os.rename(fs.path("d2"), fs.path("d/sub"))
    except OSError:
        pass  # a name that does not exist (yet): the history goes on without it


def _image_as_built_before(model: Model, choice: ImageChoice) -> dict[int, object]:
    """The image's inodes as faultfs built them before the search compared unbuilt
    candidates: the same walk, written out here so a change to it shows."""
    overlays: dict[int, dict[str, int]] = {}
    kept = set(choice.data)
    for index in sorted(choice.meta):
        op = model.meta_pending[index]
        for dir_ino, name, target in op.edits:
            entries = overlays.setdefault(dir_ino, dict(model.inodes[dir_ino].durable_entries))
            if target is None:
                entries.pop(name, None)
            else:
                entries[name] = target
        if op.flush is not None:
            kept.update(g for g, *_ in model.inodes[op.flush[0]].pending if g <= op.flush[1])
    built: dict[int, object] = {}
    seen_dirs: set[int] = set()
    stack = [ROOT_INO]
    while stack:
        node: Inode = model.inodes[stack.pop()]
        if not node.is_dir:
            if choice.tear is not None and node.ino == choice.tear[0]:
                built[node.ino] = choice.tear[1]
            else:
                ops = [op for op in node.pending if op[0] in kept]
                built[node.ino] = apply_data_ops(node.durable, ops) if ops else node.durable
            continue
        built[node.ino] = {}  # reached: a second way in is not followed
        seen_dirs.add(node.ino)
        entries: dict[str, int] = {}
        for name, target in overlays.get(node.ino, node.durable_entries).items():
            if model.inodes[target].is_dir:
                if target in seen_dirs or target in built:
                    continue
                stack.append(target)
            elif target not in built and target not in stack:
                stack.append(target)
            entries[name] = target
        built[node.ino] = entries
    return built


def _plain_search(fs: FaultFS, mode: str, seed: int) -> list[tuple[ImageChoice, object]]:
    """The search as it was: build every candidate, compare the built models."""
    power = durable_image(fs.model, ImageChoice())
    if mode == "torn":
        choices = torn_choices(fs.model, fs.block_size, seed)
    else:
        choices = reorder_choices(fs.model, seed)
    seen = set() if mode == "reorder" else {fingerprint(power)}
    seen_choices: set[ImageChoice] = set()
    found: list[tuple[ImageChoice, object]] = []
    for choice in itertools.islice(choices, LIMIT * CANDIDATES_PER_IMAGE):
        if choice in seen_choices:
            continue
        seen_choices.add(choice)
        print_ = fingerprint(durable_image(fs.model, choice))
        if print_ in seen:
            continue
        seen.add(print_)
        found.append((choice, print_))
        if len(found) >= LIMIT:
            break
    return found or [(ImageChoice(), fingerprint(power))]


@settings(max_examples=60, deadline=None)
@given(
    profile=st.sampled_from(["posix", "ext4-ordered", "lazyfs"]),
    history=ops,
    seed=st.integers(0, 3),
)
def test_the_search_finds_the_images_building_every_candidate_finds(
    profile: str, history: list[Op], seed: int
) -> None:
    fs = FaultFS(ROOT, profile, block_size=512)
    with fs:
        for op in history:
            _apply(fs, op)
    for mode in ("torn", "reorder"):
        images = list(fs.crash_images(mode, limit=LIMIT, seed=seed))
        expected = _plain_search(fs, mode, seed)
        assert [img.content_fingerprint() for img in images] == [p for _, p in expected]
        for image, (choice, _) in zip(images, expected, strict=True):
            assert image.content_fingerprint() == fingerprint(image.model)
            if image.origin is not None and image.origin.choice is not None and choice.detail:
                assert image.origin.choice == choice
    for mode in ("torn", "reorder"):
        for choice in itertools.islice(
            torn_choices(fs.model, fs.block_size, seed)
            if mode == "torn"
            else reorder_choices(fs.model, seed),
            20,
        ):
            reached = durable_reach(fs.model, choice)
            print_ = reached_fingerprint(reached)
            built = build(fs.model, reached)
            assert print_ == fingerprint(built)
            assert fingerprint(durable_image(fs.model, choice)) == print_
            built.check_invariants()
            as_before = _image_as_built_before(fs.model, choice)
            assert list(built.inodes) == list(as_before)
            for ino, node in built.inodes.items():
                assert (node.entries if node.is_dir else node.data) == as_before[ino]


def test_an_images_known_content_follows_every_change() -> None:
    fs = FaultFS(ROOT, "posix")
    with fs:
        fd = os.open(fs.path("f"), os.O_WRONLY | os.O_CREAT)
        os.write(fd, b"one")
        os.close(fd)
    reordered = list(fs.crash_images("reorder"))
    assert sorted(str(img.tree()) for img in reordered) == sorted(
        str(tree) for tree in ({}, {"f": b""}, {"f": b"one"})
    )
    image = next(img for img in reordered if img.tree() == {"f": b"one"})
    before = image.content_fingerprint()
    assert before == fingerprint(image.model)
    with image:
        fd = os.open(image.path("f"), os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"+two")
        os.close(fd)
    assert image.tree() == {"f": b"one+two"}
    assert image.content_fingerprint() == fingerprint(image.model) != before
    with image:
        os.rename(image.path("f"), image.path("g"))
    assert image.tree() == {"g": b"one+two"}
    again = FaultFS.from_snapshot(image.snapshot())
    assert again.content_fingerprint() == image.content_fingerprint() == fingerprint(again.model)
