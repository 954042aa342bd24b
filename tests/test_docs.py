"""Every environment flag is documented in one place, docs/env.md."""
from pathlib import Path

from eqgrad import config


def test_every_flag_is_documented():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "env.md").read_text()
    missing = [name for name in config.FLAGS if f"`{name}`" not in doc]
    assert not missing, f"flags missing from docs/env.md: {missing}"
