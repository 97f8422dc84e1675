"""A page-cache model that keeps only what the process sees (``durable_state=False``).

:class:`~faultfs._model.Model` keeps three layers per file (visible, durable,
pending) so that a crash image can be built from any point of a run. A run
whose crashes are all process kills (a kill keeps the page cache) never reads
the durable layer or the pending operations: its only crash image is what the
process saw. :class:`ProcessModel` drops that bookkeeping: a write changes the
visible bytes and nothing else, an fsync of a file or a directory changes
nothing, a namespace change edits the visible entries only. The operations,
their boundaries, the clock and so every file time stay exactly as in a
:class:`Model`, so a program sees the same file system either way.

What needs the durable layer (power, torn and reorder images, ``tree(durable=True)``,
cause analysis) refuses such a model with :func:`need_durable`, rather than
answering from a durable layer that was never kept.
"""

from __future__ import annotations

from faultfs._model import Inode, Model
from faultfs.errors import ConfigError


class ProcessModel(Model):
    """A :class:`Model` without the durable layer: process images only."""

    __slots__ = ()
    keeps_durable = False

    # Everything a process sees, and nothing else.
    change_namespace = Model.edit_visible
    write = Model.write_visible
    truncate = Model.truncate_visible

    def fsync_file(self, node: Inode) -> None:
        """Nothing to make durable: no durable layer is kept."""

    def fsync_dir(self, node: Inode) -> None:
        """Nothing to make durable: no durable layer is kept."""


def need_durable(model: Model, what: str) -> None:
    """Refuse ``what`` (a reader of the durable layer) on a model that does not keep it."""
    if not model.keeps_durable:
        raise ConfigError(
            f"{what} needs the durable state, which this FaultFS does not keep (it was "
            "made with durable_state=False: process crash images only); make it with "
            "durable_state=True (the default) to build power, torn or reorder images"
        )
