"""How a command ends when it cannot do its job: one line on the terminal and exit code 2, never a traceback.

Exit codes of every command: 0 done (for solve: resolved), 1 the model tried and did not resolve (or mining found
nothing), 2 could not run: bad arguments or settings, an unreachable endpoint, the sandbox, or a crash in bugsweep
itself. A crash's traceback goes to a log file whose path the one line names; 130 / 143 after Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import contextlib
import signal
import tempfile
import threading
import traceback
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.markup import escape

from bugsweep.errors import Terminated

EXIT_COULD_NOT_RUN = 2
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143

err = Console(stderr=True, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises Terminated instead of ending the process at once (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, frame: FrameType | None) -> None:
        # One orderly stop: a second SIGTERM must not interrupt the cleanup the first one started.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def could_not_run(message: str, kind: str | None = None) -> int:
    """Print the one line for a failure that is not the model's; returns the exit code."""
    label = f" ({kind})" if kind else ""
    err.print(f"[red bold]could not run[/]{label}: {escape(one_line(message))}")
    return EXIT_COULD_NOT_RUN


def crashed(exc: BaseException, log_dir: Path | None = None) -> int:
    """A bug in bugsweep: the traceback goes to a log file (in `log_dir`, else the temporary folder), the terminal
    gets one line naming it. Returns the exit code."""
    log = write_crash_log(exc, log_dir)
    where = f"traceback in {log}" if log else "the traceback could not be written"
    err.print(
        f"[red bold]could not run[/] (crash, a bug in bugsweep): {escape(one_line(f'{type(exc).__name__}: {exc}'))}"
        f" ({escape(where)})"
    )
    return EXIT_COULD_NOT_RUN


def write_crash_log(exc: BaseException, log_dir: Path | None = None) -> Path | None:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    text = "".join(traceback.format_exception(exc))
    for folder in (log_dir, Path(tempfile.gettempdir())):
        if folder is None:
            continue
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / ("crash.log" if folder == log_dir else f"bugsweep-crash-{stamp}-{id(exc):x}.log")
            path.write_text(text, encoding="utf-8")
            return path.resolve()
        except OSError:
            continue
    return None


def settings_problem(exc: Any) -> str:
    """One line for a pydantic ValidationError of a settings class: which variable, what is wrong with it.

    The input value is quoted, except for secrets (api keys), which are never shown."""
    prefix = _env_prefix(getattr(exc, "title", ""))
    problems = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error.get("loc", ())) or "?"
        name = f"{prefix}{field}".upper() if prefix else field
        shown = "" if "key" in field.lower() else f" (got {str(error.get('input'))[:40]!r})"
        problems.append(f"{name}: {error.get('msg', 'invalid')}{shown}")
    return "bad setting " + "; ".join(problems)


def is_settings(exc: Any) -> bool:
    """Whether a pydantic ValidationError is about a settings class (read from the environment)."""
    return bool(_env_prefix(getattr(exc, "title", "")))


def _env_prefix(class_name: str) -> str:
    """The environment prefix of the settings class of that name (LLM_ for ModelSettings, ...); "" if none."""
    from pydantic_settings import BaseSettings

    classes: list[type[BaseSettings]] = [BaseSettings]
    while classes:
        cls = classes.pop()
        if cls.__name__ == class_name:
            return str(cls.model_config.get("env_prefix") or "")
        classes.extend(cls.__subclasses__())
    return ""


def one_line(text: str, limit: int = 600) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
