"""The benchmark script runs and its results match NumPy (a smoke run at 1/16 size; speed is
measured by bench/, never asserted in tests)."""
import importlib.util
import json
import sys
from pathlib import Path


def test_bench_core_quick_run_matches_numpy(tmp_path, capsys):
    path = Path(__file__).resolve().parent.parent / "bench" / "bench_core.py"
    spec = importlib.util.spec_from_file_location("bench_core", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_core"] = bench          # its dataclasses look their module up
    spec.loader.exec_module(bench)
    out = tmp_path / "core.json"
    rc = bench.main(["--quick", "--frameworks", "eqgrad,numpy", "--eqgrad-devices", "LLVM", "--reps", "1",
                     "--warmup", "0", "--peak-gflops", "100", "--peak-gbs", "10", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    res = json.loads(out.read_text())["results"]
    names = {w.name for w in bench.WORKLOADS}
    assert {r["workload"] for r in res} == names
    assert all(r["status"] == "ok" for r in res), [r for r in res if r["status"] != "ok"]
    eq = [r for r in res if r["framework"] == "eqgrad[LLVM]"]
    assert all(r["kernels_per_run"] and r["efficiency"] is not None for r in eq)
