"""Every environment flag is documented in one place, docs/env.md."""
from pathlib import Path

from eqgrad import config


def test_every_flag_is_documented():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "env.md").read_text()
    missing = [name for name in config.FLAGS if f"`{name}`" not in doc]
    assert not missing, f"flags missing from docs/env.md: {missing}"


def test_the_package_version_is_pyprojects():
    """eqgrad.__version__ (what the kernel cache's keys hold) is the version pyproject.toml builds."""
    import re
    import eqgrad
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', text, re.M).group(1) == eqgrad.__version__


def test_dist_version_reads_what_importlib_metadata_reads():
    """cache.dist_version (used in cache keys instead of importing importlib.metadata at a first
    realize) agrees with importlib.metadata for the installed dependencies."""
    import importlib.metadata
    from eqgrad.cache import dist_version
    for name in ("egglog", "numpy", "llvmlite"):
        assert dist_version(name) == importlib.metadata.version(name)
    assert dist_version("no_such_distribution_eqgrad") == "?"
