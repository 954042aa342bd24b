"""The benchmark script runs and its results match NumPy (a smoke run at 1/16 size; speed is
measured by bench/, never asserted in tests)."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest


def _script(name: str):
    """A bench/ script imported as a module (its dataclasses look their module up in sys.modules)."""
    path = Path(__file__).resolve().parent.parent / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.parametrize("half", [0, 1])
def test_bench_core_quick_run_matches_numpy(tmp_path, capsys, half):
    """Every workload, in two halves (every other one) that the test workers run side by side: one
    run of all of them was the suite's longest test (54 s), alone on one worker at the end."""
    bench = _script("bench_core")
    out = tmp_path / "core.json"
    names = {w.name for w in bench.WORKLOADS[half::2]}
    rc = bench.main(["--quick", "--frameworks", "eqgrad,numpy", "--eqgrad-devices", "LLVM", "--reps", "1",
                     "--warmup", "0", "--idle", "0", "--no-gc", "--peak-gflops", "100", "--peak-gbs", "10", "--json", str(out),
                     "--only", ",".join(w.name for w in bench.WORKLOADS[half::2])])
    text = capsys.readouterr().out
    assert rc == 0, text
    res = json.loads(out.read_text())["results"]
    assert {r["workload"] for r in res} == names
    assert {"cnn_step", "cnn_pool_step", "ffn_step", "layernorm_backward"} <= {w.name for w in bench.WORKLOADS if w.train}
    train = {w.name for w in bench.WORKLOADS[half::2] if w.train}
    # NumPy is the reference of a training row (its forward loss), not a timed column
    assert all(r["status"] == ("skipped" if r["workload"] in train and r["framework"] == "numpy" else "ok")
               for r in res), [r for r in res if r["status"] != "ok"]
    eq = [r for r in res if r["framework"] == "eqgrad[LLVM]"]
    assert all(r["kernels_per_run"] for r in eq)
    assert all(r["efficiency"] is not None for r in eq if r["workload"] not in train)


def test_bench_compile_quick_run_has_the_columns_and_a_right_chain(tmp_path, capsys):
    """bench_compile.py --quick on its three cheapest cases, each in a fresh process: every row has the
    table's columns (the compile split from the wrapped compile_plan included) and the chain's result
    matches NumPy's."""
    bench = _script("bench_compile")
    out = tmp_path / "compile.json"
    rc = bench.main(["--quick", "--no-tinygrad", "--cases", "first_realize,chain,scalar", "--values", "8",
                     "--timeout", "300", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    data = json.loads(out.read_text())
    assert {"cpu", "cores", "eqgrad_commit"} <= set(data["environment"])
    rows = {r["case"]: r for r in data["rows"]}
    assert set(rows) == {"first_realize", "chain", "scalar"}
    for r in rows.values():
        assert r["status"] == "ok", r
        assert {"wall_s", "saturate_s", "extract_s", "compile_s", "plans_compiled", "target", "ratio", "pass"} <= set(r)
        assert r["wall_s"] > 0 and r["plans_compiled"] is not None, r
    for name in ("first_realize", "chain"):          # each compiles its one plan in the timed region
        assert rows[name]["plans_compiled"] >= 1 and rows[name]["saturate_s"] > 0, rows[name]
    assert rows["chain"]["result_ok"] is True and rows["chain"]["detail"]["ops"] == 40
    assert rows["scalar"]["detail"]["values"] == 8 and rows["scalar"]["result_ok"] is True
    assert "chain" in text and "first_realize" in text


def test_bench_model_records_every_kernel_of_a_step(tmp_path, capsys):
    """bench_model.py --quick: each workload's kernels are timed one by one through
    GlobalCounters.kernel_log (printing nothing), pieces of one plan kernel summed into it."""
    from eqgrad import GlobalCounters
    bench = _script("bench_model")
    out = tmp_path / "model.json"
    rc = bench.main(["--quick", "--reps", "2", "--warmup", "0", "--only", "matmul512,ffn_step,bert_encoder",
                     "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert GlobalCounters.kernel_log is None
    written = json.loads(out.read_text())
    # the machine check after the first workload and at the end (its value is this machine's: not checked)
    assert len(written["two_core_speedup"]) == 2 and all(x > 0 for x in written["two_core_speedup"])
    assert "two threads did" in text
    res = {r["workload"]: r for r in written["results"]}
    assert set(res) == {"matmul512", "ffn_step", "bert_encoder"}
    for r in res.values():
        assert r["kernels"] == len(r["rows"]) > 0 and 0 <= r["within_2x"] <= r["kernels"]
        assert all(k["measured_s"] > 0 and k["predicted_s"] > 0 and k["kernel"].startswith("k") for k in r["rows"])
        assert len({k["kernel"] for k in r["rows"]}) == r["kernels"]          # one row per plan kernel
        assert all(all(len(x) == 2 and x[0] > 0 for x in k["reads"]) for k in r["rows"])
    # from the encoder's second kernel on, kernels read what earlier ones wrote (a reuse distance)
    assert any(d is not None for k in res["bert_encoder"]["rows"] for _, d in k["reads"])
    # ... some of it from cache by the cost model (cost.py): each row keeps what that took off its
    # prediction, and the run says what the share would be without that term
    assert all(k["warm"] >= 0 for r in res.values() for k in r["rows"])
    assert any(k["warm"] > 0 and k["stats"]["hot"] > 0 for k in res["bert_encoder"]["rows"])
    assert "reads from cache:" in text and "without that term" in text
    assert "kernels within 2x" in text and "  k" not in text.split("workload")[0]


def test_bench_model_reads_carry_their_reuse_distance():
    """reads_in_order: each kernel's reads with the bytes moved since the buffer was last touched
    (None for a buffer the step had not touched), over the pieces a plan kernel ran as."""
    from eqgrad import float32
    from eqgrad.graph.plan import Kernel, KNode
    bench = _script("bench_model")

    def buf(b, n):
        return KNode("BUF", (), b, (n,), float32)

    def kern(name, out, srcs):                      # out = the sum of the sources, elementwise
        ast = srcs[0] if len(srcs) == 1 else KNode("ADD", tuple(srcs), None, srcs[0].shape, float32)
        return Kernel(name, out, ast, tuple(dict.fromkeys(s.arg for s in srcs)))
    ks = [kern("k0", 2, [buf(0, 100)]),                  # 400 B in, 400 out
          kern("k1g", 3, [buf(1, 1000)]),               # a piece of k1: 4000 in, 4000 out
          kern("k1", 4, [buf(3, 1000), buf(2, 1000)]),  # 4000 + 4000 in (b2 viewed wider), 4000 out
          kern("k2", 5, [buf(2, 100), buf(0, 100)])]
    got = bench.reads_in_order([(k.name, 0.0, 0.0, 0, 0, k) for k in ks])
    assert got == {"k0": [[400, None]], "k1": [[4000, None], [4000, 0], [4000, 8000]],
                   "k2": [[400, 0], [400, 20000]]}       # b2 last touched by k1, b0 by k0


def test_bench_model_fit_finds_parameters_that_explain_kernels_made_with_them():
    """bench_model.py --fit: kernels timed exactly as the cost model's form says under some
    parameters are all explained (100 % within 2x) by the parameters it finds, and the kernels of a
    kind are priced at their own rate (a contraction at 300 GFLOP/s, streaming work at 20); the small
    kernels that ran right after a stream took the given ``cold`` term more (cost.py)."""
    from eqgrad.extract.cost import DeviceParams
    bench = _script("bench_model")
    launch, bw, peak, con, cold = 6e-6, 18e9, 20e9, 300e9, 20e-6
    rows = []
    for i, (nbytes, flops, kind) in enumerate([(4e3, 1e3, []), (2e6, 1e5, []), (3e7, 2e6, []), (8e6, 4e8, []),
                                                (6e6, 5.6e8, ["contraction"]), (3e6, 2.7e8, ["contraction"]),
                                                (1e6, 1e9, ["contraction"]), (5e4, 1e6, ["row-fused"]),
                                                (4e3, 1e3, [])]):
        after = i in (1, 8)               # (k8 is k0 right after a stream)
        t = launch + max(nbytes / bw, flops / (con if "contraction" in kind else peak)) + cold * after
        stats = dict(nbytes=nbytes, flops=flops, nodes=5, cflops=flops if "contraction" in kind else 0.0,
                     fill=1.0, library=0.0)
        rows.append(dict(kernel=f"k{i}", measured_s=t, gbs=nbytes / t / 1e9, gflops=flops / t / 1e9,
                         model_kind=kind, lowering_kind=kind, stats=stats, after=after))
    share, got = bench.fit(rows, DeviceParams(cold=cold, stream_bytes=1 << 20))
    assert share == 1.0, got
    # without the term, the same 4 KB kernel taking 6 us and 26 us right after a stream cannot both
    # be within 2x
    share_off, _ = bench.fit([dict(r, after=False) for r in rows], DeviceParams())
    assert share_off < 1.0
    assert 100e9 < got["contraction"] and got["peak"] < 60e9, got
