"""Messages that sent an outside reviewer the wrong way, now saying what applies."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from faultfs import (
    ConfigError,
    FailedHealthCheck,
    FaultFS,
    OutsideRootError,
    SimulatedCrash,
    explore,
)


def test_a_file_the_code_names_in_the_temp_directory_is_not_called_tempfiles() -> None:
    path = os.path.join(tempfile.gettempdir(), "faultfs-wording-outside.log")
    fs = FaultFS("/wording", outside="refuse")
    with fs, pytest.raises(OutsideRootError) as caught:
        open(path, "w").close()
    message = str(caught.value)
    assert "tempfile's default directory" not in message
    assert "build the path from the root (fs.path(...))" in message
    assert not os.path.exists(path)


def test_a_tempfile_in_the_temp_directory_still_gets_the_temp_dir_fix() -> None:
    tempfile.gettempdir()
    fs = FaultFS("/wording", outside="refuse")
    with fs, pytest.raises(OutsideRootError) as caught:
        tempfile.mkstemp()
    assert "this is tempfile's default directory" in str(caught.value)


def save(path: str) -> None:
    with open(path, "w") as handle:
        handle.write("x")
        handle.flush()
        os.fsync(handle.fileno())


def test_the_outside_root_advice_under_passthrough_does_not_ask_for_passthrough(
    tmp_path: Path,
) -> None:
    real = tmp_path / "real.txt"

    def workload(fs: FaultFS) -> None:
        save(fs.path("state"))
        save(str(real))
        fs.ack(1)

    with pytest.raises(FailedHealthCheck) as caught:
        explore(workload, lambda img: img.read_file("state"), outside="passthrough")
    message = str(caught.value)
    assert "pass outside='passthrough'" not in message
    assert "outside='passthrough' is set already" in message
    assert "suppress_health_check=[faultfs.HealthCheck.outside_root]" in message


def test_a_crash_images_repr_names_the_crash_not_its_root() -> None:
    fs = FaultFS("/wording")
    fs.arm(1)
    with pytest.raises(SimulatedCrash), fs:
        save(fs.path("state"))
    image = fs.crash_image("power")
    text = repr(image)
    assert text.startswith("<FaultFS crash image boundary=1 mode=power image=#0 seed=0 (")
    assert "root=" not in text and "boundaries" not in text
    assert repr(fs) == "<FaultFS root='/wording' profile=posix crashed>"


def test_faultfs_explore_with_mode_says_modes(faultfs_explore: Any) -> None:
    with pytest.raises(ConfigError, match=r"no argument 'mode'; did you mean modes='power'\?"):
        faultfs_explore(lambda fs: None, lambda img: None, mode="power")
