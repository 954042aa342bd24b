"""The wheel works: ``pip install .`` ships the rulebooks and every subpackage, and an
installed eqgrad saturates, with no checkout in sight.

Slower than the rest (marked ``slow``, still part of ``make test``): it builds a wheel from a copy of
the checkout and installs it into a fresh virtual environment, without network: build
dependencies come from this interpreter's environment (``--no-build-isolation``), runtime
dependencies from a ``.pth`` file pointing at this environment's site-packages (which holds only
an editable finder for eqgrad, never the checkout's source itself).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

from eqgrad.rules.book import BUILTIN_RULEBOOKS, load_rulebook

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# what a checkout holds besides the source: environments, build outputs, caches (not copied)
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
                                     ".pytest_cache", ".eqgrad_cache", "results")


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 180) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{' '.join(cmd)} exited with {res.returncode}:\n{res.stdout}\n{res.stderr}"
    return res.stdout


def _fresh_venv(where: Path) -> Path:
    """A new venv (its python) that sees this environment's packages through a ``.pth`` file but no
    eqgrad: this environment holds eqgrad only as an editable finder, whose own ``.pth`` a path
    added by a ``.pth`` does not run."""
    venv.create(where, with_pip=False, symlinks=os.name != "nt")
    py = where / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=where).strip())
    deps = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    for d in deps:
        assert not Path(d, "eqgrad").exists() and Path(d).resolve() != ROOT, \
            f"{d} would make a checkout's eqgrad importable in the fresh venv"
    (site / "eqgrad_test_deps.pth").write_text("".join(d + "\n" for d in deps))
    return py


def _pip_install(py: Path, *args: str) -> None:
    """Install into the venv of ``py`` with this environment's pip and build backend (no download);
    ``--ignore-installed``: the ``.pth`` shows this environment's eqgrad metadata to pip."""
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
          "--no-build-isolation", "--ignore-installed", *args], cwd=py.parent)


def _clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a program run in a fresh venv: no PYTHONPATH, no eqgrad flags."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("EQGRAD_")}
    env["EQGRAD_CACHE_DIR"] = str(tmp / "cache")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout's source (a build in the checkout itself would write build/ and
    eqgrad.egg-info there, and two test workers would race on them)."""
    src = tmp_path_factory.mktemp("source") / "eqgrad-src"
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCE)
    return src


@pytest.fixture(scope="module")
def wheel(source: Path) -> Path:
    dist = source.parent / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", str(dist), str(source)], cwd=source.parent)
    (whl,) = dist.glob("eqgrad-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh venv with the wheel installed: (its python, an environment without the checkout)."""
    tmp = tmp_path_factory.mktemp("venv")
    py = _fresh_venv(tmp / "env")
    _pip_install(py, str(wheel))
    return py, _clean_env(tmp)


def test_wheel_ships_every_rulebook_and_subpackage(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    eggs = sorted(p.name for p in (ROOT / "rulebooks").glob("*.egg"))
    assert "schedule.egg" in eggs
    missing = [f"eqgrad/rulebooks/{e}" for e in eggs if f"eqgrad/rulebooks/{e}" not in names]
    assert not missing, f"the wheel lacks the rulebooks {missing}"
    subpackages = sorted(str(p.parent.relative_to(ROOT)) for p in (ROOT / "eqgrad").rglob("__init__.py")
                         if "__pycache__" not in p.parts)
    assert {"eqgrad", "eqgrad/graph", "eqgrad/engine", "eqgrad/rules", "eqgrad/tools"} <= set(subpackages)
    missing = [p for p in subpackages if f"{p}/__init__.py" not in names]
    assert not missing, (f"the wheel lacks the subpackages {missing}: list them in pyproject.toml's "
                         "[tool.setuptools] packages")
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "eqgrad").rglob("*.py") if "__pycache__" not in p.parts)
    missing = [m for m in modules if m not in names]
    assert not missing, f"the wheel lacks the modules {missing}"


def test_sdist_ships_the_rulebooks(source: Path, tmp_path: Path):
    # the PEP 517 hook every frontend calls (python -m build is not installed here)
    hook = f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path)!r}))"
    name = _run([sys.executable, "-c", hook], cwd=source).strip().splitlines()[-1]
    with tarfile.open(tmp_path / name) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    want = {f"rulebooks/{p.name}" for p in (ROOT / "rulebooks").glob("*.egg")} | {"rulebooks/__init__.py"}
    assert want <= names, f"the sdist lacks {sorted(want - names)}"


PROGRAM = textwrap.dedent("""
    import json, sys, warnings
    import eqgrad
    from eqgrad import Tensor
    from eqgrad.counters import EqgradWarning
    from eqgrad.rules.book import RULEBOOK_DIR
    warnings.simplefilter("error", EqgradWarning)   # a saturation that stops early fails here
    out = (Tensor([1.0, 2.0], device="LLVM") * 2 + 1).exp().sum()
    value = float(out.numpy())
    cp = eqgrad.engine.last_plan
    print(json.dumps(dict(file=eqgrad.__file__, prefix=sys.prefix, rulebooks=str(RULEBOOK_DIR), value=value,
                          stop=cp.report.stop_reason, kernels=len(cp.plan.kernels))))
""")


def test_installed_wheel_saturates_outside_the_checkout(installed: tuple[Path, dict[str, str]], tmp_path: Path):
    py, env = installed
    got = json.loads(_run([str(py), "-c", PROGRAM], cwd=tmp_path, env=env).strip().splitlines()[-1])
    prefix = Path(got["prefix"]).resolve()
    assert Path(got["file"]).resolve().is_relative_to(prefix), f"imported {got['file']}, not the installed wheel"
    assert not Path(got["file"]).resolve().is_relative_to(ROOT / "eqgrad")
    assert Path(got["rulebooks"]).resolve().is_relative_to(prefix), \
        f"the rulebooks were read from {got['rulebooks']}, not from the installed package"
    assert got["value"] == pytest.approx(math.exp(3.0) + math.exp(5.0), rel=1e-5)
    assert got["stop"] == "completed"
    assert got["kernels"] == 1, "the rules did not run: map, exp and sum were not fused into one kernel"


def test_installed_cli_checks_a_rule(installed: tuple[Path, dict[str, str]], tmp_path: Path):
    py, env = installed
    rule = load_rulebook(ROOT / "rulebooks" / "algebra.egg").rules[0].name
    out = _run([str(py), "-m", "eqgrad", "rules", "check", "--rule", rule, "-n", "4"], cwd=tmp_path, env=env)
    assert "1 rules:" in out and "unsound" not in out, out


LOCATE = textwrap.dedent("""
    import importlib.util, json
    from eqgrad.rules.book import RULEBOOK_DIR, builtin_config
    cfg = builtin_config()                          # reads every built-in rulebook and the schedule
    spec = importlib.util.find_spec("eqgrad.rulebooks")
    print(json.dumps(dict(rulebooks=str(RULEBOOK_DIR), package=spec.origin if spec else None,
                          read=len(cfg.texts) + bool(cfg.schedule_text))))
""")


def test_editable_install_reads_the_rulebooks_as_package_data(source: Path, tmp_path: Path):
    py = _fresh_venv(tmp_path / "env")
    _pip_install(py, "-e", str(source))
    got = json.loads(_run([str(py), "-c", LOCATE], cwd=tmp_path, env=_clean_env(tmp_path)).strip().splitlines()[-1])
    assert got["package"] == str(source / "rulebooks" / "__init__.py"), \
        f"the editable install does not map eqgrad.rulebooks to the checkout's rulebooks/: {got}"
    assert Path(got["rulebooks"]) == source / "rulebooks" and got["read"] == len(BUILTIN_RULEBOOKS) + 1


def test_plain_checkout_on_pythonpath_reads_its_rulebooks(source: Path, tmp_path: Path):
    py = _fresh_venv(tmp_path / "env")
    env = _clean_env(tmp_path, PYTHONPATH=str(source))
    got = json.loads(_run([str(py), "-c", LOCATE], cwd=tmp_path, env=env).strip().splitlines()[-1])
    assert got["package"] is None                   # nothing installed: the checkout's folder, by path
    assert Path(got["rulebooks"]) == source / "rulebooks" and got["read"] == len(BUILTIN_RULEBOOKS) + 1
