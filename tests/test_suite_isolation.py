"""The suite's own reproducibility: it runs in a cache directory of its own."""
from __future__ import annotations

import os
from pathlib import Path

from eqgrad.cache import _default_dir, cache_dir


def test_the_suite_runs_in_a_cache_directory_of_its_own():
    """What ``tune calibrate`` or a benchmark stored in the user's cache must not
    steer the suite's plans (tests/conftest.py gives the run an empty directory)."""
    d = cache_dir()
    assert d is not None and d == Path(os.environ["PYTEST_EQGRAD_CACHE_DIR"])
    user = Path(_default_dir()).resolve()
    assert d.resolve() != user and user not in d.resolve().parents
