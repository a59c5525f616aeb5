"""The record of one agent run: every message, tool call, tool result, token count and timing, in order.

Events are plain JSON-serialisable dicts, each with a "type" (meta, message, model_reply, tool, context_shortened,
model_retry, stop, crash) and "t" (seconds since the run started). Each event is serialised once, when it happens,
so later changes to the live history (the context-length shortening) never rewrite what was recorded, and a save
after every step only joins strings. Saves are atomic (a temporary file renamed over the old one), so a crash or a
kill leaves the previous complete file. Secrets passed in are replaced by "***" wherever they would appear (the API key
only ever travels in a request header, so this is a second line of defence; values under 8 characters, such as the
dummy keys of local servers, are not treated as secrets because replacing them would garble the record).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class Trajectory:
    def __init__(self, path: Path | None = None, *, secrets: Iterable[str] = ()) -> None:
        self.path = path
        self.secrets = [s for s in secrets if len(s) >= 8]
        self.started = time.monotonic()
        self._events: list[dict[str, Any]] = []
        self._serialised: list[str] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def add(self, type_: str, **fields: Any) -> dict[str, Any]:
        """Record one event (stamped with its time) and return it as stored."""
        text = json.dumps(
            {"type": type_, "t": round(self.elapsed(), 4), **fields}, ensure_ascii=False, default=str
        )
        for secret in self.secrets:
            text = text.replace(secret, "***")
        event: dict[str, Any] = json.loads(text)
        self._events.append(event)
        self._serialised.append(text)
        return event

    @property
    def events(self) -> list[dict[str, Any]]:
        return list(self._events)

    def save(self) -> None:
        """Write the whole record to `path` atomically. No-op without a path."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = "[\n" + ",\n".join(self._serialised) + "\n]\n"
        fd, tmp = tempfile.mkstemp(prefix=".trajectory-", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def load(path: Path) -> list[dict[str, Any]]:
    """Read a trajectory file back as its list of events."""
    events: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return events


def messages(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as it was sent to the model (before any shortening), rebuilt from the events."""
    out: list[dict[str, Any]] = []
    for event in events:
        if event.get("type") in ("message", "model_reply"):
            out.append(event["message"])
    return out
