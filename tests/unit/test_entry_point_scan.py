"""The providers' entry points are read without importlib.metadata when nothing can
declare one (``registry.entry_points``): the same answer as importlib.metadata's."""

from __future__ import annotations

import importlib.metadata
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from substrat.providers import registry

GROUP = registry.ENTRY_POINT_GROUP


def dist_info(site: Path, name: str, entry_points: str | None) -> Path:
    """A distribution's metadata directory as ``pip install`` leaves it."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    if entry_points is not None:
        (info / "entry_points.txt").write_text(entry_points)
    return info


def scanned(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each scan of the installed distributions importlib.metadata makes from now on."""
    scans: list[str] = []
    real = importlib.metadata.distributions

    def recording(**params: object) -> object:
        scans.append("scan")
        return real(**params)  # type: ignore[call-overload]

    monkeypatch.setattr(importlib.metadata, "distributions", recording)
    return scans


def names(found: Sequence[importlib.metadata.EntryPoint]) -> list[tuple[str, str]]:
    return sorted((ep.name, ep.value) for ep in found)


def test_no_distribution_declaring_the_group_means_no_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    dist_info(site, "tool", "[console_scripts]\ntool = tool:main\n")
    dist_info(site, "bare", None)  # no entry points at all
    (site / "old.egg-info").write_text("Metadata-Version: 1.0\n")  # a file, not a directory
    monkeypatch.setattr(sys, "path", [str(site), str(tmp_path / "missing")])
    scans = scanned(monkeypatch)
    assert registry.entry_points(group=GROUP) == ()
    assert scans == []  # importlib.metadata scanned nothing
    assert names(importlib.metadata.entry_points(group=GROUP)) == []  # and would say the same


def test_a_distribution_declaring_the_group_is_read_by_importlib_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    dist_info(site, "tool", "[console_scripts]\ntool = tool:main\n")
    dist_info(site, "echo_provider", f"[{GROUP}]\necho = echo_provider:EchoProvider\n")
    monkeypatch.setattr(sys, "path", [str(site)])
    scans = scanned(monkeypatch)
    assert names(registry.entry_points(group=GROUP)) == [("echo", "echo_provider:EchoProvider")]
    assert scans == ["scan"]


@pytest.mark.parametrize("layout", ["zip", "egg", "other-finder"])
def test_what_it_cannot_read_itself_goes_to_importlib_metadata(
    layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path: list[object] = []
    if layout == "zip":  # a zip archive on sys.path, with a declaring distribution inside
        archive = tmp_path / "plugins.zip"
        with zipfile.ZipFile(archive, "w") as zipped:
            zipped.writestr("zp-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: zp\n")
            zipped.writestr("zp-0.1.dist-info/entry_points.txt", f"[{GROUP}]\nzp = zip:P\n")
        path.append(str(archive))
    elif layout == "egg":  # an egg directory on sys.path: its metadata is EGG-INFO
        egg = tmp_path / "eggy-0.1.egg"
        (egg / "EGG-INFO").mkdir(parents=True)
        (egg / "EGG-INFO" / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: eggy\n")
        (egg / "EGG-INFO" / "entry_points.txt").write_text(f"[{GROUP}]\neggy = egg:P\n")
        path.append(str(egg))
    else:  # a finder of distributions beside the default one

        class Finder:
            @staticmethod
            def find_distributions(context: object = None) -> list[object]:
                return []

            @staticmethod
            def find_spec(*args: object) -> None:
                return None

        monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder])
    monkeypatch.setattr(sys, "path", path)
    scans = scanned(monkeypatch)
    found = registry.entry_points(group=GROUP)
    assert scans == ["scan"]
    assert names(found) == names(importlib.metadata.entry_points(group=GROUP))
    if layout != "other-finder":
        assert names(found) == [({"zip": "zp", "egg": "eggy"}[layout], f"{layout}:P")]


def test_the_real_installation_gets_importlib_metadata_s_answer() -> None:
    for group in (GROUP, "console_scripts", "pytest11", "substrat.no-such-group"):
        ours = names(registry.entry_points(group=group))
        assert ours == names(importlib.metadata.entry_points(group=group)), group
