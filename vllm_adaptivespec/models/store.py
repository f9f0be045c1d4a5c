"""The on-disk cache: where things live, and how a model directory becomes valid.

A model directory is built under a temporary name beside its final one, its
manifest is written last, and only then is it renamed into place. So a
directory at the final path with a matching manifest is always complete, and an
interrupted build leaves only a ``.partial`` directory that the next build removes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

MANIFEST = "adaptivespec-model.json"
MANIFEST_FORMAT = 1


def cache_root() -> Path:
    """``$ADAPTIVESPEC_CACHE``, else ``~/.cache/vllm-adaptivespec``."""
    env = os.environ.get("ADAPTIVESPEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "vllm-adaptivespec"


def wheels_dir(root: Path) -> Path:
    return root / "wheels"


def models_dir(root: Path) -> Path:
    return root / "models"


def read_manifest(model_dir: Path) -> dict | None:
    try:
        return json.loads((model_dir / MANIFEST).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def is_complete(model_dir: Path, source: dict) -> bool:
    """True when ``model_dir`` was finished from exactly ``source``."""
    manifest = read_manifest(model_dir)
    return (
        manifest is not None
        and manifest.get("format") == MANIFEST_FORMAT
        and manifest.get("source") == source
    )


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Serialize builds in ``directory`` across processes (two `prepare` runs at once)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def partial_dirs(final: Path) -> list[Path]:
    return sorted(final.parent.glob(f".{final.name}.partial-*"))


@contextlib.contextmanager
def building(final: Path, source: dict) -> Iterator[tuple[Path, dict]]:
    """Yield an empty directory to fill and a dict of details for its manifest.

    On success the directory gets its manifest and becomes ``final``; on any error
    (or interrupt) it is removed. Call under `locked(final.parent)`: leftovers of
    interrupted builds are removed first.
    """
    for stale in partial_dirs(final):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = final.parent / f".{final.name}.partial-{os.getpid()}"
    tmp.mkdir(parents=True)
    started = time.time()
    details: dict = {}
    try:
        yield tmp, details
        manifest = {
            "format": MANIFEST_FORMAT,
            "source": source,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.time() - started, 1),
            **details,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
