"""Names and small helpers every part of the local backend shares."""

from __future__ import annotations

from pathlib import Path

#: The user commands run as inside the sandbox (mapped to the caller's own uid on the host).
SANDBOX_UID = 1000
SANDBOX_USER = "sandbox"
#: Writable inside; HOME, the repository's parent, and where `pip install` puts packages (the user scheme).
WORKSPACE = "/workspace"


def write_text(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def short(command: str) -> str:
    return command if len(command) <= 60 else command[:57] + "..."
