"""Progress of long compiles (eqgrad/progress.py, EQGRAD_PROGRESS)."""
from __future__ import annotations

import io
import time

import numpy as np

import eqgrad
from eqgrad import Tensor, engine, progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_compile_says_what_it_is_doing(capsys):
    x = Tensor(np.random.default_rng(0).random((16, 16), dtype=np.float32))
    y = x
    for i in range(120):
        y = (y * 1.01 + 0.5).relu() if i % 2 else y.permute(1, 0).exp2() * 0.001
    engine.clear_cache()
    with eqgrad.Context(PROGRESS=0.05):
        y.realize()
    err = capsys.readouterr().err.splitlines()
    lines = [ln for ln in err if ln.startswith("eqgrad: compiling")]
    assert lines, err
    assert "ops on LLVM" in lines[0]
    assert lines[-1].split(": ", 2)[2].startswith("done (") and "kernels" in lines[-1] and lines[-1].endswith(" s")


def test_a_short_compile_and_progress_off_are_silent(capsys):
    x = Tensor(np.ones(4, np.float32))
    with eqgrad.Context(PROGRESS=0):
        for i in range(3):
            (x * float(i + 2) - 1).exp2().realize()
    (x + 7).sqrt().realize()                        # the default delay: 2 s
    assert "eqgrad: compiling" not in capsys.readouterr().err


def test_log_lines_and_the_terminal_status_line():
    out = io.StringIO()
    p = progress.Progress("a test program", 0.01, stream=out)
    p.phase("saturating")
    time.sleep(0.1)
    p.phase("compiling kernels", total=4)
    p.update(done=3)
    p.close()
    text = out.getvalue()
    assert "eqgrad: compiling a test program: saturating" in text
    assert text.rstrip().endswith(" s") and "done (4 kernels)" in text.splitlines()[-1]
    tty = _Terminal()
    p = progress.Progress("a test program", 0.01, stream=tty)
    p.phase("extracting", e_classes=1234, plan_evaluations=5)
    time.sleep(0.1)
    p.close()
    assert "extracting (1,234 e-classes, 5 plan evaluations)" in tty.getvalue() or "done (" in tty.getvalue()


def test_nested_compiles_report_into_the_outer_one():
    with eqgrad.Context(PROGRESS=5):
        with progress.compiling("outer") as outer:
            with progress.compiling("inner") as inner:
                progress.phase("extracting", e_classes=3)
            assert inner is outer and outer.info["e_classes"] == 3
