"""Frictions for tuning researchers, each reproduced: a partial DeviceParams override
keeps the calibration (a whole DeviceParams that replaces one warns), explain() names the custom
cost function and parameters the plan was chosen under (also when printed after the using()
block), and save() renders the format its suffix names."""
import shutil

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor
from eqgrad.counters import EqgradWarning
from eqgrad.extract import cost_model, using
from eqgrad.extract.cost import DeviceParams, params_for, save_calibration


@pytest.fixture
def calibrated(tmp_path, monkeypatch):
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    cal = DeviceParams(launch=3e-6, bandwidth=12.5e9, peak=77e9, source="calibrated 2026-12-03")
    save_calibration("LLVM", cal)
    assert params_for("LLVM").bandwidth == 12.5e9
    return cal


def test_a_dict_overrides_only_its_fields(calibrated):
    with using(params={"LLVM": {"launch": 1e-6}}):
        p = cost_model("LLVM").params
    assert (p.launch, p.bandwidth, p.peak) == (1e-6, 12.5e9, 77e9)
    assert p.source == "calibrated 2026-12-03 with launch=1e-06"
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['lanch'\]"):
        with using(params={"LLVM": {"lanch": 1e-6}}):
            pass
    with pytest.raises(ValueError, match="DeviceParams.bandwidth"):
        with using(params={"LLVM": {"bandwidth": 0.0}}):
            pass


def test_a_whole_deviceparams_replacing_a_calibration_warns(calibrated):
    with pytest.warns(EqgradWarning, match=r"replaces all of LLVM's calibrated 2026-12-03 parameters.*pass a dict"):
        with using(params={"LLVM": DeviceParams(launch=1e-6)}):
            p = cost_model("LLVM").params
    assert p.bandwidth == DeviceParams().bandwidth and p.source == "given"


def my_cost(stats, params):
    return params.launch + stats.nbytes / params.bandwidth + stats.flops / params.peak


def test_explain_names_the_custom_cost_function_and_parameters(calibrated):
    x = Tensor(np.ones((64, 128), np.float32))
    with using(cost_fn=my_cost, params={"LLVM": {"launch": 2e-6}}):
        e = eqgrad.explain(x.softmax(-1))
        inside = str(e)
    outside = str(e)                      # printed after the block: still the model it was planned under
    for text in (inside, outside):
        assert "custom cost function my_cost with cost model calibrated 2026-12-03 with launch=2e-06" in text
        assert "launch 2.0 us" in text and "12.5 GB/s" in text
    plain = str(eqgrad.explain(x.softmax(-1)))
    assert "custom cost function" not in plain and "cost model calibrated 2026-12-03:" in plain


def test_save_renders_the_suffix_format(tmp_path):
    e = eqgrad.explain(Tensor(np.ones((8, 8), np.float32)).exp().sum(1))
    assert e.save(tmp_path / "p.dot").read_text().startswith("digraph")
    with pytest.raises(ValueError, match=r"unknown format '\.bmpx'.*\.png"):
        e.save(tmp_path / "p.bmpx")
    if shutil.which("dot") is None:
        with pytest.raises(RuntimeError, match=r"wrote .*p\.dot; rendering \.png needs Graphviz"):
            e.save(tmp_path / "p.png")
        return
    png = e.save(tmp_path / "p.png")
    assert png.suffix == ".png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "p.dot").exists()
    assert e.save(tmp_path / "p.pdf").read_bytes()[:4] == b"%PDF"


def test_experiment_programs_from_the_command_line(tmp_path, monkeypatch):
    from eqgrad.tools.cli import experiment_programs, load_callable
    with pytest.raises(ValueError, match=r"unknown program 'foo'; the built-in ones are softmax, layernorm"):
        experiment_programs("foo")                       # it ran the defaults silently
    assert list(experiment_programs("softmax,layernorm")) == ["softmax", "layernorm"]
    (tmp_path / "myprogs.py").write_text("import numpy as np\nfrom eqgrad import Tensor\n"
                                         "def relu_sum():\n    return Tensor(np.ones((4, 4), np.float32)).relu().sum(1)\n"
                                         "def cost(stats, params):\n    return stats.nbytes / params.bandwidth\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    progs = experiment_programs("myprogs:relu_sum")
    (out,) = progs["myprogs:relu_sum"]()
    assert out.tolist() == [4.0] * 4
    assert load_callable("myprogs:cost", "--cost").__name__ == "cost"
    for bad, msg in (("myprogs:nope", "has no function 'nope'"), ("nomodule_xyz:f", "cannot import"),
                     ("myprogs", "expected module:function")):
        with pytest.raises(ValueError, match=msg):
            load_callable(bad, "--cost")


def test_rules_stats_runs_examples_with_their_own_argv(tmp_path, monkeypatch):
    from eqgrad.tools.stats import run_corpus
    import eqgrad.tools.stats as stats_mod
    monkeypatch.setattr(stats_mod, "corpus", lambda: {})
    ex = tmp_path / "examples"
    ex.mkdir()
    (ex / "a_args.py").write_text("import argparse, sys\nargparse.ArgumentParser().parse_args()\n"
                                  "open(sys.argv[0] + '.ran', 'w').write(' '.join(sys.argv[1:]))\n")
    (ex / "b_extra.py").write_text("import not_installed_extra_xyz\n")
    monkeypatch.setattr("sys.argv", ["python -m eqgrad", "rules", "stats", "--top", "3"])
    st = run_corpus(examples=ex)
    assert (ex / "a_args.py.ran").read_text() == ""        # it did not see `rules stats --top 3`
    assert "ModuleNotFoundError" in st.skipped["b_extra.py"] and "a_args.py" not in st.skipped
    assert "skipped b_extra.py: ModuleNotFoundError" in st.report([])


def test_experiment_rows_carry_status_runs_and_a_csv(tmp_path):
    import csv
    from eqgrad.tools.experiments import format_table, rows_to_csv, rows_to_json, run_experiment
    x = Tensor(np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32))
    rows = run_experiment({"sm": lambda: [x.softmax(-1)]}, ("greedy", "ilp"), device="LLVM", reps=3,
                          candidates=2, progress=False)
    main = {r.extractor: r for r in rows if not r.candidate}
    assert main["greedy"].status == "complete" and len(main["greedy"].runs) == 3
    assert main["ilp"].status.split(":")[0] in ("optimal", "time limit (best found)", "fallback to greedy", "skipped")
    table = format_table(rows)
    assert "status" in table and main["ilp"].status in table and "pools programs" in table
    assert rows_to_json(rows)[0]["spread"] == main["greedy"].spread >= 0
    with open(rows_to_csv(rows, str(tmp_path / "r.csv"))) as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == sum(len(r.runs) for r in rows) and {"run", "seconds", "status"} <= set(lines[0])


def test_explain_shows_the_extractors_status():
    from eqgrad.extract import using
    x = Tensor(np.ones((32, 64), np.float32))
    with using(extractor="ilp"):
        text = str(eqgrad.explain(x.softmax(-1)))
    assert "(extractor ilp [" in text
    assert any(s in text for s in ("[optimal]", "[time limit", "[fallback to greedy", "[skipped"))


def test_a_program_whose_plans_are_all_predicted_equal_has_no_correlation_and_no_warning():
    """The 2-layer MLP step's ten plans were all predicted 1012.6 us: scipy warned (ConstantInputWarning)
    and the table printed "+nan"; now it says why there is no rank correlation."""
    import warnings
    from eqgrad.tools.experiments import Row, format_table, rank_correlation
    rows = [Row("mlp", "default", e, 7, 1e-3, m, runs=(m,)) for e, m in
            [("greedy", 6.8e-3), ("improve", 6.9e-3), ("ilp", 7.1e-3), ("measured", 6.7e-3)]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rank_correlation(rows) != rank_correlation(rows)          # NaN
        text = format_table(rows)
    assert "mlp        n/a: every plan tried was predicted the same time  (4 plans)" in text and "nan" not in text
