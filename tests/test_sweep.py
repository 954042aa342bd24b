"""Parameter sweeps (eqgrad/tools/sweep.py, `python -m eqgrad tune sweep`): the grid and its
validation, a sweep in local processes and the same sweep as Ray tasks on a local Ray instance
started here (the merged tables agree), the CSV, JSON and plot files."""
import csv
import json
import sys
import tempfile

import pytest

from eqgrad.tools.cli import main
from eqgrad.tools.sweep import grid_points, parse_grid, parse_param, run_sweep

PROG = "sweep_progs_tiny:softmax"


@pytest.fixture(scope="module", autouse=True)
def tiny_program(tmp_path_factory):
    """A small program as module:function, importable here and (through the sweep's sys.path) in
    the processes and Ray workers."""
    d = tmp_path_factory.mktemp("progs")
    (d / "sweep_progs_tiny.py").write_text(
        "import numpy as np\nfrom eqgrad import Tensor\n"
        "X = Tensor(np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32))\n"
        "def softmax():\n    return X.softmax(-1)\n")
    sys.path.insert(0, str(d))
    yield
    sys.path.remove(str(d))
    sys.modules.pop("sweep_progs_tiny", None)


def _key(sweep):
    return [(r.program, r.params, r.extractor, r.kernels, round(r.predicted, 15)) for r in sweep.rows]


def test_the_grid_and_its_errors():
    assert parse_param("launch=1e-6, 5e-6") == ("launch", [1e-6, 5e-6])
    assert parse_param("max_nodes=40,160") == ("max_nodes", [40, 160])
    assert parse_param("row_fusion=true,0") == ("row_fusion", [True, False])
    grid = parse_grid(["launch=1e-6,5e-6", "bandwidth=1e10,4e10,8e10"])
    points = grid_points(grid)
    assert len(points) == 6 and points[0] == (("bandwidth", 1e10), ("launch", 1e-6))
    assert grid_points({}) == [()]
    for bad, msg in (("lanch=1", r"unknown parameter 'lanch'; the DeviceParams fields are launch, bandwidth, peak"),
                     ("launch", "expected NAME=V1,V2"), ("launch=fast", "'fast' is not a float"),
                     ("bandwidth=0", "DeviceParams.bandwidth"), ("max_nodes=1.5", "'1.5' is not an int"),
                     ("launch=,", "no values")):
        with pytest.raises(ValueError, match=msg):
            parse_param(bad)
    with pytest.raises(ValueError, match="given twice"):
        parse_grid(["launch=1e-6", "launch=2e-6"])
    with pytest.raises(ValueError, match=r"unknown extractor\(s\) \['gready'\]"):
        run_sweep(PROG, "gready", {"launch": [1e-6]})
    with pytest.raises(ValueError, match="unknown program 'nope'"):
        run_sweep("nope", "greedy", {})
    with pytest.raises(ValueError, match="unknown device 'TPU'"):
        run_sweep(PROG, "greedy", {}, device="TPU")


def test_the_command_line_rejects_bad_input(capsys):
    for argv, msg in ((["--param", "lanch=1e-6"], "unknown parameter 'lanch'"),
                      (["--param", "launch=x"], "'x' is not a float"),
                      (["--extractors", "greedy,nope"], "unknown extractor"),
                      (["--programs", "nope"], "unknown program 'nope'"),
                      (["--jobs", "0"], "--jobs: expected an integer >= 1")):
        assert main(["tune", "sweep", "--programs", PROG, *argv]) == 2
        assert msg in capsys.readouterr().err


def test_a_local_sweep_writes_one_table_csv_json_and_plot(tmp_path, capsys):
    argv = ["tune", "sweep", "--programs", PROG, "--extractors", "greedy", "--param", "launch=1e-6,50e-6",
            "--reps", "2", "--jobs", "1", "--no-progress", "--csv", str(tmp_path / "s.csv"),
            "--json", str(tmp_path / "s.json"), "--plot", str(tmp_path / "s.png")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "launch" in out and "5e-05" in out and "1e-06" in out and "2 jobs (2 grid points) on in-process" in out
    rows = json.loads((tmp_path / "s.json").read_text())
    assert [r["params"] for r in rows] == [{"launch": 1e-6}, {"launch": 5e-5}]
    assert all(len(r["runs"]) == 2 and r["measured"] > 0 for r in rows)
    with open(tmp_path / "s.csv") as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == 4 and {lines[0]["launch"], lines[2]["launch"]} == {"1e-06", "5e-05"}
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def local_sweep():
    """2 launch values x 2 extractors, predicted only, in 2 spawned processes."""
    s = run_sweep(PROG, "greedy,improve", {"launch": [1e-6, 50e-6]}, measure=False, jobs=2, progress=False)
    assert s.backend == "2 local processes"
    return s


def test_local_processes_give_every_grid_point(local_sweep, tmp_path):
    assert [(dict(r.params)["launch"], r.extractor) for r in local_sweep.rows] == \
        [(1e-6, "greedy"), (1e-6, "improve"), (5e-5, "greedy"), (5e-5, "improve")]
    assert all(r.kernels >= 1 and r.predicted > 0 and not r.runs for r in local_sweep.rows)
    # the grid point's launch is in the prediction: the same plan costs more at 50 us per kernel
    assert local_sweep.rows[2].predicted > local_sweep.rows[0].predicted
    assert _key(run_sweep(PROG, "greedy,improve", {"launch": [1e-6, 50e-6]}, measure=False, jobs=1,
                          progress=False)) == _key(local_sweep)
    assert "measured" not in local_sweep.table().split("\n")[-1]         # no parallel-measurement note
    assert local_sweep.plot(str(tmp_path / "p.png")) and (tmp_path / "p.png").stat().st_size > 1000


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")        # short: Ray's socket paths have a length limit
    ctx = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=tmp)
    yield ctx.address_info["gcs_address"]
    ray.shutdown()


@pytest.mark.slow
def test_a_ray_sweep_equals_the_local_one(ray_cluster, local_sweep):
    s = run_sweep(PROG, "greedy,improve", {"launch": [1e-6, 50e-6]}, measure=False, ray_address=ray_cluster,
                  progress=False)
    assert s.backend == f"ray {ray_cluster}" and len(s.rows) == 4
    assert _key(s) == _key(local_sweep)
    assert "4 jobs (2 grid points) on ray" in s.table()
