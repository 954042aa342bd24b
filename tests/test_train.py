"""The digits example (examples/train_digits.py) trains both models to >= 97% test accuracy,
kept short: a few epochs, jitted steps."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("sklearn", reason="the digits example needs scikit-learn (dev extra)")
pytest.importorskip("tqdm", reason="the digits example needs tqdm (dev extra)")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_digits.py"


def _example():
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("model, epochs", [("mlp", 10), ("cnn", 5)])
def test_digits_reach_97_percent(model, epochs):
    r = _example().train(model, epochs, progress=False)
    assert r["accuracy"] >= 0.97, r
    assert r["final_loss"] < 0.6, r
