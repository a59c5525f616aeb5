"""What bugsweep puts into a graded test run, and how the run is started.

- **The probe** (bugsweep/grading/probe/) goes into the task environment's own site-packages: its modules
  (`PROBE_FILES`) and a `.pth` line that loads the first one, by its path, when the interpreter starts
  (`install_probe`). Nothing of it is in the test process's environment: no variable, no path. It is written the
  same way into the regrade's two fresh sandboxes, and taken out of the agent's sandbox after the baseline
  (`remove_probe`).
- **The environment's facts** (`EnvFacts`), read by the task's own interpreter before the change is applied: its
  site-packages, the top-level modules it provides (the shadowing rule, bugsweep.grading.testfiles), and the pytest
  plugins its setup installed (entry points of the group `pytest11`). Graded runs turn pytest's plugin autoloading
  off and load those by name (`-p`), so a plugin the change brings (packaging metadata is dropped anyway) never
  loads.
- **The wrapper** (`wrapper_script`): the command's stdin holds bugsweep's instruction; the wrapper moves it to
  file descriptor 97, sends descriptor 98 to the command's stderr (the probe's records) and everything the test
  command prints to its stdout (the log), both captured outside the sandbox; no file in the sandbox holds either.
  In the mirror pair the instruction stays a pipe, read once by the one test runner (`exclusive`); elsewhere it is a
  deleted file that every Python process of the command reads from its start (a test command of several steps).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
import shlex
import tarfile
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from bugsweep.grading import probe
from bugsweep.sandbox.base import Sandbox

#: The probe's files in site-packages; the .pth sorts before every other (its line runs first at start-up).
PROBE_MODULE = probe.MODULES[0]
PROBE_FILES = tuple(f"{module}.py" for module in probe.MODULES)
PTH_NAME = "00-bugsweep-probe.pth"
INSTRUCTION_FD, RECORD_FD = 97, 98
MAGIC = "bugsweep-probe-1\n"

#: Run by the task's interpreter as `python -I -c SCRIPT REPO` with the probe's files as JSON on stdin ({} for
#: none): writes them into its site-packages, then prints one JSON object: site-packages, the top-level module names
#: it provides outside the repository (stdlib, site-packages, what .pth files add), the pytest11 entry points.
FACTS_SCRIPT = r"""
import json, os, sys, sysconfig
repo = os.path.realpath(sys.argv[1])
site = sysconfig.get_paths()["purelib"]
files = json.load(sys.stdin)
for name, text in files.items():
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, name), "w", encoding="utf-8") as fh:
        fh.write(text.replace("{SITE}", site))
    os.chmod(os.path.join(site, name), 0o644)
    os.utime(os.path.join(site, name), (0, 0))
names = set(getattr(sys, "stdlib_module_names", ())) | set(sys.builtin_module_names)
for entry in sys.path:
    real = os.path.realpath(entry or ".")
    if real == repo or real.startswith(repo + os.sep) or not os.path.isdir(real):
        continue
    for name in os.listdir(real):
        if name.lower().endswith((".dist-info", ".egg-info", ".egg-link", ".pth")):
            continue
        base = name.split(".")[0]
        if base.isidentifier():
            names.add(base)
plugins = []
try:
    from importlib import metadata
    found = metadata.entry_points()
    group = found.select(group="pytest11") if hasattr(found, "select") else found.get("pytest11", ())
    for ep in group:
        if ep.name not in plugins:
            plugins.append(ep.name)
except Exception:
    pass
names.difference_update(PROBE_MODULES)
print(json.dumps({"site": site, "modules": sorted(names), "plugins": plugins}))
""".replace("PROBE_MODULES", repr(probe.MODULES))


@dataclass(frozen=True)
class EnvFacts:
    """The task environment as its own interpreter sees it, before the change."""

    site_packages: str = ""
    modules: frozenset[str] = frozenset()
    """Every top-level module name importable outside the repository."""
    plugins: tuple[str, ...] = ()
    """The pytest11 entry points installed (pytest loads these by name in graded runs)."""
    probe: bool = False
    """The probe was written into its site-packages."""


def probe_files() -> dict[str, str]:
    """Name -> text of what goes into site-packages: the probe's modules, and the .pth line that loads the first by
    its path ("{SITE}" stands for the site-packages folder: FACTS_SCRIPT fills it in)."""
    package = resources.files("bugsweep.grading.probe")
    files = {name: package.joinpath(name).read_text(encoding="utf-8") for name in PROBE_FILES}
    load = (
        "import importlib.util as u\\n"
        f"if {PROBE_MODULE!r} not in sys.modules:\\n"
        f" s = u.spec_from_file_location({PROBE_MODULE!r}, '{{SITE}}/{PROBE_FILES[0]}')\\n"
        " m = u.module_from_spec(s)\\n"
        f" sys.modules[{PROBE_MODULE!r}] = m\\n"
        " s.loader.exec_module(m)"
    )
    files[PTH_NAME] = f'import sys; exec("{load}")\n'
    return files


def install_probe(sandbox: Sandbox, *, probe: bool = True) -> EnvFacts:
    """Write the probe into the task environment's site-packages (`probe=True`) and read its facts, with one run of
    its interpreter. Empty facts where that interpreter cannot tell (no Python: the probe is then not there)."""
    files = probe_files() if probe else {}
    result = sandbox.exec(
        f"python -I -c {shlex.quote(FACTS_SCRIPT)} {shlex.quote(sandbox.workdir)}",
        timeout=120,
        full_output=True,
        stdin=json.dumps(files),
        env={"PYTHONDONTWRITEBYTECODE": "1"},
    )
    try:
        facts: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1]) if result.ok else {}
    except (ValueError, IndexError):
        facts = {}
    return EnvFacts(
        site_packages=str(facts.get("site") or ""),
        modules=frozenset(facts.get("modules") or ()),
        plugins=tuple(str(p) for p in facts.get("plugins") or ()),
        probe=bool(files) and bool(facts),
    )


def copy_probe(sandbox: Sandbox, facts: EnvFacts) -> EnvFacts:
    """Write the probe into another sandbox of the same task state whose facts are known (`install_probe` read them
    in the first): one shell command, no interpreter started. The files come out the same as there (their mode, and
    the time 0 as their mtime in both)."""
    if not facts.probe or not facts.site_packages:
        return install_probe(sandbox)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, text in probe_files().items():
            data = text.replace("{SITE}", facts.site_packages).encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    site = shlex.quote(facts.site_packages)
    result = sandbox.exec(
        f"mkdir -p {site} && base64 -d | tar -x -o -C {site}",
        timeout=120,
        stdin=base64.b64encode(buffer.getvalue()).decode(),
    )
    return (
        facts
        if result.ok
        else EnvFacts(site_packages=facts.site_packages, modules=facts.modules, plugins=facts.plugins)
    )


def remove_probe(sandbox: Sandbox, facts: EnvFacts) -> None:
    """Take the probe out of a sandbox the agent works in next."""
    if facts.site_packages:
        paths = " ".join(shlex.quote(f"{facts.site_packages}/{name}") for name in (*PROBE_FILES, PTH_NAME))
        sandbox.exec(f"rm -f {paths}", timeout=60)


#: The length of a run's nonce, in hex digits (the same in every run: the two instructions of the pair have one length).
NONCE_HEX = 32


@dataclass
class Instruction:
    """What the probe is told (the same in both runs of the pair but for `mirror` and `nonce`, of the same length)."""

    limit: float = 0.0
    armed: dict[str, object] | None = None
    """The test the mirror's statement fails in: its id as the runner names it, its function's file, qualname, line."""
    inject: list[tuple[str, list[tuple[str, int]]]] = field(default_factory=list)
    """The functions that get bugsweep's statement: (file, [(qualname, line where it failed before, or 0), ...])."""
    mirror: bool = False
    nonce: str = ""
    """NONCE_HEX hex digits (the pair's runs: each its own), that the probe writes in its "reached" records."""
    memory: int = 0
    """Bytes the test runner's process may hold while a test runs (0: no bound; the same in both runs of the pair)."""
    skip: list[str] = field(default_factory=list)
    """pytest node ids the runner deselects: a run again after its test process died while they ran (never the pair's)."""

    def encode(self) -> str:
        body = json.dumps(
            {
                "armed": self.armed,
                "inject": self.inject,
                "limit": self.limit,
                "memory": self.memory,
                "mirror": int(self.mirror),
                "nonce": self.nonce,
                "skip": self.skip,
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        return MAGIC + body


_DISABLED_PLUGIN = re.compile(r"(?:^|\s)-p\s*no:([A-Za-z0-9_.-]+)")


def for_command(facts: EnvFacts, test_command: str) -> EnvFacts:
    """`facts` without the plugins the test command disables (`-p no:NAME`, which pytest also reads as
    `pytest_NAME`): graded runs load the others by name, before the command's own options, so a plugin today's
    pytest refuses (a mined task's command disables it) would stop every run."""
    disabled = set(_DISABLED_PLUGIN.findall(test_command))
    if not disabled:
        return facts
    disabled |= {f"pytest_{name}" for name in disabled}
    return dataclasses.replace(facts, plugins=tuple(p for p in facts.plugins if p not in disabled))


def graded_env(facts: EnvFacts, *, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The variables every graded run has (the same in both runs of the pair): pytest loads the probe and the task
    environment's plugins by name and nothing else; no bytecode is written."""
    options = [f"-p {PROBE_MODULE}", "-p no:cacheprovider", *(f"-p {shlex.quote(p)}" for p in facts.plugins)]
    env = {
        "PYTEST_ADDOPTS": " ".join(options),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return {**env, **(extra or {})}


@dataclass
class Wrapped:
    """A test command as the sandbox runs it."""

    script: str
    env: dict[str, str] = field(default_factory=dict)
    stdin: str = ""


def wrapper_script(test_command: str, seconds: int, *, exclusive: bool) -> str:
    """bash that runs the test command under `timeout`, its output on stdout, the probe's records on stderr, the
    instruction (stdin) on descriptor 97: a pipe (`exclusive`: the one runner reads it, then nothing is left) or a
    deleted file every Python process of the command reads."""
    if exclusive:
        feed = f"exec {INSTRUCTION_FD}<&0"
    else:
        feed = f'__i=$(mktemp) && cat > "$__i" && exec {INSTRUCTION_FD}<"$__i"; rm -f "$__i"; unset __i'
    return (
        f"exec {RECORD_FD}>&2 2>&1; {feed}; exec 0</dev/null; "
        f"timeout --verbose -k 10 {seconds} bash -c {shlex.quote(test_command)}"
    )
