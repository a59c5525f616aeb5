"""PYTEST_DONT_REWRITE: bugsweep's instruction, read once, and the closures that keep its secrets and record "reached"."""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
from typing import Any

MAGIC = b"bugsweep-probe-1\n"


def read(fd):
    """The instruction on descriptor `fd` (97: a pipe, read to its end; a file, read from its start), or None. The
    descriptor is closed once read (a file's only when it held the instruction: a descriptor 97 of a process that
    bugsweep did not start is left alone)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return None
    data = b""
    close = True
    try:
        if stat.S_ISREG(mode):
            data = os.pread(fd, 1 << 24, 0)
            close = data.startswith(MAGIC)
        elif stat.S_ISFIFO(mode):
            os.set_blocking(fd, False)
            deadline = time.monotonic() + 2.0  # the host wrote it all before the command started
            while time.monotonic() < deadline:
                try:
                    chunk = os.read(fd, 1 << 20)
                except BlockingIOError:
                    if data and not MAGIC.startswith(data[: len(MAGIC)]):
                        break  # not bugsweep's
                    import select

                    select.select([fd], [], [], 0.05)
                    continue
                if not chunk:
                    break
                data += chunk
        else:
            close = False
            return None
    except OSError:
        return None
    finally:
        if close:
            try:  # noqa: SIM105
                os.close(fd)
            except OSError:
                pass
    if not data.startswith(MAGIC):
        return None
    try:
        return json.loads(data[len(MAGIC) :].decode())
    except ValueError:
        return None


def targets(instruction, record):
    """{file: {qualname: line}}: the functions that get bugsweep's statement (the armed test's among them); `record`
    says what it cannot read."""
    found: Any = {}
    for entry in instruction.get("inject") or ():
        try:
            file, functions = entry
            for qualname, line in functions:
                found.setdefault(str(file), {})[str(qualname)] = int(line or 0)
        except (TypeError, ValueError):
            record("probe-error", "bad inject entry: " + repr(entry)[:200])
    armed = instruction.get("armed")
    if isinstance(armed, dict) and armed.get("file") and armed.get("qualname"):
        functions = found.setdefault(str(armed["file"]), {})
        functions[str(armed["qualname"])] = int(armed.get("line") or 0)
    return found


def private(instruction, ours, fd):
    """The run's secrets, and what the statement's answer depends on, in closures only: whether this is the mirror,
    the run's nonce, the armed test, the code objects compiled with bugsweep's statement, the test the runner runs.

    `ours`: the code of the probe's `expect` and `expect_args`, the only callers `decide` answers; `fd`: where records
    go. Returns (set_current, register, decide): the runner's hooks say which test runs (`set_current`), the compile
    hooks give the code objects they made (`register`), and `expect`/`expect_args` ask `decide`. None of them is kept
    in a module attribute, here or in the probe; replacing `expect`, `expect_args` or `_decide` by name stops the
    "reached" records (the real run then has none) and makes the mirror's armed test pass (caught either way)."""
    mirror = bool(instruction.get("mirror"))
    nonce = str(instruction.get("nonce") or "")
    armed = instruction.get("armed") if isinstance(instruction.get("armed"), dict) else {}
    armed_id = armed.get("id")
    armed_key = (str(armed.get("file") or ""), str(armed.get("qualname") or ""))
    keys: Any = {}  # id(code) -> (file, qualname) as the instruction names them
    lines: Any = {}  # (file, qualname) -> the lines its statements carry
    kept = []  # the registered code objects, alive so that their ids stay theirs
    current: Any = [None]  # (test id, thread) while the runner runs a test's body
    write, dumps, getframe, ident = os.write, json.dumps, sys._getframe, threading.get_ident

    def set_current(test_id):
        current[0] = (test_id, ident()) if test_id is not None else None

    def register(key, codes, at):
        for code in codes:
            if id(code) not in keys:
                kept.append(code)
                keys[id(code)] = key
        lines[key] = frozenset(lines.get(key, frozenset()) | frozenset(at))

    def decide():
        caller = getframe(1)
        if not any(caller.f_code is c for c in ours):
            return False
        frame: Any = caller.f_back
        key = keys.get(id(frame.f_code)) if frame is not None else None
        if key is None or frame.f_lineno not in lines.get(key, ()):
            return False
        now = current[0]
        if now is None or now[1] != ident():
            return False
        outer = frame.f_back  # its own outermost call only: not the test's function run again inside itself
        while outer is not None:
            if keys.get(id(outer.f_code)) == key:
                return False
            outer = outer.f_back
        if nonce:
            try:  # noqa: SIM105
                write(fd, ("\n" + dumps(["reached", now[0], key[0], key[1], nonce]) + "\n").encode())
            except (OSError, ValueError, TypeError):
                pass
        return mirror and now[0] == armed_id and key == armed_key

    return set_current, register, decide
