"""setuptools' build backend, behind a check of the Python it builds for.

pip runs the build backend in the interpreter it installs into, before it
resolves any dependency. Older pips (23.0, as pyenv's 3.10 ships it) resolve
the ``[dev]`` extra before they look at ``requires-python``, so on Python 3.10
``pip install -e '.[dev]'`` failed with "No matching distribution found for
zizmor>=1.32" and never said the Python was the problem. Refusing here, at
import, names the reason whatever the pip.
"""

# Written for any Python pip may run it in (no f-strings, no annotations, no
# __future__ import): an old interpreter must reach the check, not a SyntaxError.
import sys

MINIMUM = (3, 11)

if sys.version_info < MINIMUM:
    sys.exit(
        "substrat needs Python %d.%d or newer; this is Python %s (%s). Create the "  # noqa: UP031
        "virtualenv with a newer Python, e.g. python3.11 -m venv .venv"
        % (MINIMUM[0], MINIMUM[1], sys.version.split()[0], sys.executable)
    )

from setuptools.build_meta import *  # noqa: E402, F403  (the hooks pip calls)
