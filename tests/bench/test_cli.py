"""`adaptivespec bench` arguments: presets, overrides, missing models, the configuration list."""

from __future__ import annotations

import pytest

from vllm_adaptivespec.bench.settings import PRESETS, QUICK_HUMANEVAL
from vllm_adaptivespec.cli_bench import standalone


def test_missing_models_point_to_models_prepare(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("ADAPTIVESPEC_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(SystemExit) as exc:
        standalone(["--output", str(tmp_path / "out")])
    assert "adaptivespec models prepare --pair qwen-coder" in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_missing_target_directory_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="is not a directory"):
        standalone(["--target", str(tmp_path / "nope")])


def test_list_prints_every_row(capsys):
    assert standalone(["--list"]) == 0
    text = capsys.readouterr().out
    for name in ("ar", "static-k8", "ngram", "dynamic", "policy-only", "pinned-k2", "pinned-k4", "margin-k4@<tau>",
                 "adaptive@<tau>"):
        assert name in text


def test_presets_and_overrides(tmp_path):
    import argparse

    from vllm_adaptivespec.cli_bench import add_parser, build_settings

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", "--mode", "quick"])
    quick = build_settings(args, "/t", "/d")
    assert quick.humaneval_problems == QUICK_HUMANEVAL and quick.budget_minutes == 14.0
    assert quick.configs == PRESETS["quick"]["configs"] and quick.temperatures == [0.0]
    args = parser.parse_args(["bench", "--mode", "full", "--humaneval-problems", "all", "--taus", "0.3,0.9",
                              "--temperatures", "0.7,0", "--budget-minutes", "0"])
    full = build_settings(args, "/t", "/d")
    assert full.humaneval_problems is None and full.general_limit is None
    assert full.taus == [0.9, 0.3] and full.temperatures == [0.0, 0.7] and full.budget_minutes is None
    assert full.configs == ["all"] and full.max_tokens["humaneval"] > quick.max_tokens["humaneval"]


def test_lean_preset_and_repeats(tmp_path):
    import argparse

    from vllm_adaptivespec.bench.settings import LEAN_HUMANEVAL, TREE_HUMANEVAL
    from vllm_adaptivespec.cli_bench import add_parser, build_settings

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    lean = build_settings(parser.parse_args(["bench", "--mode", "lean"]), "/t", "/d")
    assert lean.configs == ["static-k2", "pinned-k2", "static-k4", "pinned-k4", "static-tree"] and lean.taus == []
    assert lean.repeats == 2 and lean.batches == [1, 8] and lean.temperatures == [0.0] and lean.budget_minutes is None
    assert set(TREE_HUMANEVAL) < set(LEAN_HUMANEVAL) and lean.humaneval_problems == LEAN_HUMANEVAL
    assert len(LEAN_HUMANEVAL) == len(set(LEAN_HUMANEVAL)) >= 20 and max(LEAN_HUMANEVAL) < 164
    assert lean.workloads == ["humaneval", "general"]
    assert lean.general_limit * lean.max_tokens["general"] >= 1500  # general prompts run to their limit
    assert build_settings(parser.parse_args(["bench", "--mode", "lean", "--repeats", "3"]), "/t", "/d").repeats == 3
    assert build_settings(parser.parse_args(["bench", "--mode", "tree"]), "/t", "/d").repeats == 1
    with pytest.raises(ValueError):  # pydantic's ValidationError
        build_settings(parser.parse_args(["bench", "--repeats", "0"]), "/t", "/d")


def test_math_workload_options_and_presets():
    import argparse

    from vllm_adaptivespec.cli_bench import add_parser, build_settings

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    for mode, preset in PRESETS.items():
        assert preset["max_tokens"]["math"] > 0 and "math_limit" in preset, mode  # math can run in every mode
    quick = build_settings(parser.parse_args(["bench"]), "/t", "/d")
    assert quick.workloads == ["humaneval", "general"] and quick.math_limit == 4  # math on request only
    full = build_settings(parser.parse_args(["bench", "--mode", "full"]), "/t", "/d")
    assert full.workloads == ["humaneval", "general", "math", "edit", "quote", "mixed"]
    assert full.math_limit is None and full.math_seed == 0
    args = parser.parse_args(["bench", "--workloads", "math,humaneval", "--math-limit", "12", "--math-seed", "3",
                              "--max-tokens-math", "200"])
    chosen = build_settings(args, "/t", "/d")
    assert chosen.workloads == ["math", "humaneval"] and (chosen.math_limit, chosen.math_seed) == (12, 3)
    assert chosen.max_tokens == {**PRESETS["quick"]["max_tokens"], "math": 200}
    with pytest.raises(ValueError, match="unknown workloads"):
        build_settings(parser.parse_args(["bench", "--workloads", "maths"]), "/t", "/d")
    with pytest.raises(ValueError):
        build_settings(parser.parse_args(["bench", "--workloads", "math", "--math-limit", "0"]), "/t", "/d")


def test_math_settings_enter_the_fingerprint_only_when_math_runs(tmp_path):
    import hashlib
    import json

    from vllm_adaptivespec.bench.settings import BenchSettings

    base = dict(target="/t", drafter="/d", configs=["ar"], taus=[], batches=[1], temperatures=[0.0],
                humaneval_problems=[0], general_limit=4, output=tmp_path)
    old = dict(base, workloads=["humaneval", "general"], max_tokens={"humaneval": 64, "general": 40})
    plain = BenchSettings(**old)
    with_math_lengths = BenchSettings(**{**old, "max_tokens": {"humaneval": 64, "general": 40, "math": 128},
                                         "math_limit": 4, "math_seed": 5})
    keys = ("target", "drafter", "workloads", "humaneval_problems", "humaneval_format", "general_limit",
            "max_tokens", "max_model_len", "enforce_eager", "dtype")
    before_math = hashlib.sha256(json.dumps({k: getattr(plain, k) for k in keys}, sort_keys=True,
                                            default=str).encode()).hexdigest()[:16]
    assert plain.fingerprint() == with_math_lengths.fingerprint() == before_math  # runs without math still resume
    math = dict(base, workloads=["math"], max_tokens={"math": 128})
    assert BenchSettings(**math, math_limit=4).fingerprint() != BenchSettings(**math, math_limit=8).fingerprint()
    assert BenchSettings(**math, math_seed=1).fingerprint() != BenchSettings(**math).fingerprint()
    with pytest.raises(ValueError, match="no max_tokens for workloads"):
        BenchSettings(**dict(base, workloads=["math"], max_tokens={"humaneval": 64}))


def test_copying_workload_options_presets_and_fingerprint(tmp_path):
    import argparse

    from vllm_adaptivespec.bench.settings import BenchSettings
    from vllm_adaptivespec.cli_bench import add_parser, build_settings

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    for mode, preset in PRESETS.items():  # every mode can run them
        for workload in ("edit", "quote", "mixed"):
            assert preset["max_tokens"][workload] > 0 and f"{workload}_limit" in preset, (mode, workload)
    quick = build_settings(parser.parse_args(["bench"]), "/t", "/d")
    assert (quick.edit_limit, quick.quote_limit, quick.mixed_limit) == (4, 4, 8)
    args = parser.parse_args(["bench", "--workloads", "edit,quote,mixed", "--edit-limit", "6", "--quote-limit", "5",
                              "--mixed-limit", "12", "--max-tokens-quote", "80"])
    chosen = build_settings(args, "/t", "/d")
    assert chosen.workloads == ["edit", "quote", "mixed"] and chosen.max_tokens["quote"] == 80
    assert (chosen.edit_limit, chosen.quote_limit, chosen.mixed_limit) == (6, 5, 12)
    base = dict(target="/t", drafter="/d", configs=["ar"], taus=[], batches=[1], temperatures=[0.0],
                humaneval_problems=[0], general_limit=4, output=tmp_path)
    plain = BenchSettings(**base, workloads=["humaneval", "general"], max_tokens={"humaneval": 64, "general": 40})
    lengths = {"humaneval": 64, "general": 40, "edit": 256, "quote": 48, "mixed": 256}
    unused = BenchSettings(**base, workloads=["humaneval", "general"], max_tokens=lengths, edit_limit=3)
    assert plain.fingerprint() == unused.fingerprint()  # runs without them keep their fingerprint
    edit = dict(base, workloads=["edit"], max_tokens={"edit": 256})
    assert BenchSettings(**edit, edit_limit=4).fingerprint() != BenchSettings(**edit, edit_limit=8).fingerprint()
