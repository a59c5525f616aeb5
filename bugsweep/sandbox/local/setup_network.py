"""The setup step's network: the internet and package registries, not the host.

A command run with `network=True` (the task's setup: `pip install -e .`, build backends, post-install hooks)
gets its own network namespace, like every other command, plus user-mode networking from `slirp4netns`
(Debian `slirp4netns`): a tap device inside whose traffic slirp4netns turns into ordinary sockets of this
host process. Inside, the namespace's routing table sends to nowhere
- the host's loopback: slirp4netns's `--disable-host-loopback` refuses connections to its gateway address,
  which would otherwise reach the host's 127.0.0.1 (the Prefect API, a model server, an S3 server);
- the host's own addresses and the networks they are on (the worker's neighbours);
- private, shared, link-local (cloud metadata at 169.254.169.254), multicast and reserved ranges;
and DNS goes to slirp4netns's forwarder, which asks the host's resolvers from outside. Only the namespace's
init holds the routes' capabilities: the command runs without any (bubblewrap drops them), so it cannot change
them. `allow` (settings: `setup_network_allow`) names ranges that stay reachable anyway, e.g. a package mirror
on the company network.

How it is wired: bubblewrap makes the namespace and waits on `--block-fd`; `SetupNetwork.start(pid)` attaches
slirp4netns (in a mount namespace of its own, all private: see `start`) to the namespace of the command's
init, waits for its ready signal, installs the routes with `nsenter --net ip -batch -`, and then the caller
lets bubblewrap go on. `stop()` ends slirp4netns (closing its exit fd, then SIGKILL if it lingers) and waits
for it.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import os
import select
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass

from bugsweep.errors import ConfigError, SandboxError

INSTALL_HINT = (
    "install slirp4netns, iproute2 and util-linux: "
    "`apt-get install slirp4netns iproute2 util-linux` (Debian/Ubuntu)"
)

#: Never reachable from the setup step (besides the host's own addresses and networks, found at start).
BLOCKED_RANGES = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12", "192.0.0.0/24",
    "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
)  # fmt: skip

#: Candidate subnets for the namespace's side of slirp4netns: the first that no host network overlaps is used,
#: so that an address of the namespace's own subnet can never be one of the worker's neighbours.
_SLIRP_SUBNETS = ("10.0.2.0/24", "172.31.254.0/24", "192.168.254.0/24")
_READY_TIMEOUT_S = 10.0


def resolv_conf(subnet: ipaddress.IPv4Network) -> str:
    """The sandbox's /etc/resolv.conf for a setup command: slirp4netns's DNS forwarder (the subnet's .3)."""
    return f"nameserver {subnet.network_address + 3}\noptions edns0\n"


def choose_subnet(host_networks: Iterable[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    nets = list(host_networks)
    for candidate in map(ipaddress.IPv4Network, _SLIRP_SUBNETS):
        if not any(candidate.overlaps(net) for net in nets):
            return candidate
    raise SandboxError(
        f"the host's networks overlap every subnet the setup network could use: {_SLIRP_SUBNETS}"
    )


def host_networks() -> list[ipaddress.IPv4Network]:
    """The host's IPv4 addresses (as /32s) and the networks they are on."""
    ip = _tool("ip")
    proc = subprocess.run([ip, "-j", "-4", "addr", "show"], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise SandboxError(f"could not list the host's addresses: {proc.stderr.strip()}")
    nets: list[ipaddress.IPv4Network] = []
    for link in json.loads(proc.stdout or "[]"):
        for addr in link.get("addr_info", []):
            if addr.get("family") != "inet":
                continue
            iface = ipaddress.IPv4Interface(f"{addr['local']}/{addr['prefixlen']}")
            if iface.ip.is_loopback:
                continue  # 127/8 inside is the namespace's own loopback
            nets += [ipaddress.IPv4Network(f"{iface.ip}/32"), iface.network]
    return nets


def blocked_routes(
    host: Iterable[ipaddress.IPv4Network], allow: Iterable[str] = ()
) -> list[ipaddress.IPv4Network]:
    """What the namespace's routing table refuses: BLOCKED_RANGES and the host's networks, minus `allow`."""
    allowed = [ipaddress.IPv4Network(a, strict=False) for a in allow]
    blocked: list[ipaddress.IPv4Network] = []
    for net in [*map(ipaddress.IPv4Network, BLOCKED_RANGES), *host]:
        if net in blocked or any(net.subnet_of(a) for a in allowed):
            continue
        blocked.append(net)
    return blocked


@dataclass(frozen=True)
class NetworkPlan:
    """What a sandbox's setup commands get: the namespace's subnet and the ranges allowed despite the blocks."""

    subnet: ipaddress.IPv4Network
    allow: tuple[str, ...] = ()

    @classmethod
    def for_host(cls, allow: Iterable[str] = ()) -> NetworkPlan:
        """A plan for this host (its networks decide the subnet), made once per process and `allow`. Raises
        ConfigError when a tool is missing or an allowed range is not a CIDR."""
        return _plan_for(tuple(allow))

    @classmethod
    def _make(cls, allow: tuple[str, ...]) -> NetworkPlan:
        for name in ("slirp4netns", "unshare", "nsenter", "ip"):
            _tool(name)
        allowed = tuple(allow)
        for cidr in allowed:
            try:
                ipaddress.IPv4Network(cidr, strict=False)
            except ValueError:
                raise ConfigError(
                    f"setup_network_allow: {cidr!r} is not an IPv4 range such as 10.1.0.0/16"
                ) from None
        return cls(choose_subnet(host_networks()), allowed)

    def resolv_conf_fd(self) -> int:
        """A file descriptor with the setup command's /etc/resolv.conf (for `bwrap --ro-bind-data`)."""
        fd = os.memfd_create("bugsweep-resolv", os.MFD_CLOEXEC)
        os.write(fd, resolv_conf(self.subnet).encode())
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def start(self, pid: int) -> SetupNetwork:
        return SetupNetwork.start(pid, subnet=self.subnet, allow=self.allow)


@functools.lru_cache(maxsize=8)
def _plan_for(allow: tuple[str, ...]) -> NetworkPlan:
    return NetworkPlan._make(allow)


class SetupNetwork:
    """slirp4netns attached to one command's network namespace; see the module docstring."""

    def __init__(self, proc: subprocess.Popen[bytes], exit_w: int, subnet: ipaddress.IPv4Network) -> None:
        self.proc = proc
        self.subnet = subnet
        self._exit_w: int | None = exit_w

    @classmethod
    def start(cls, pid: int, *, subnet: ipaddress.IPv4Network, allow: Iterable[str] = ()) -> SetupNetwork:
        """Give the network namespace of `pid` the setup network. Raises SandboxError when it cannot."""
        slirp = _tool("slirp4netns")
        # In a mount namespace of its own whose mounts are all private: --enable-sandbox makes only its /
        # private (not recursively) before it detaches the host's tree, and that detach would otherwise reach
        # every shared mount's peers (on systemd hosts every mount is shared), the sandboxes' mounts included.
        private = [_tool("unshare"), "--mount", "--propagation", "private", "--"]
        _wait_for_loopback(pid)
        ready_r, ready_w = os.pipe()
        exit_r, exit_w = os.pipe()
        try:
            proc = subprocess.Popen(
                # --userns-path: stay in our own user namespace (setns to it is a no-op) instead of joining the
                # target's, which bubblewrap's --disable-userns nests once more while we start
                [*private, slirp, "--configure", "--mtu=65520", "--disable-host-loopback", f"--cidr={subnet}",
                 "--userns-path=/proc/self/ns/user",
                 "--enable-sandbox", "--enable-seccomp", f"--ready-fd={ready_w}", f"--exit-fd={exit_r}",
                 str(pid), "tap0"],
                pass_fds=(ready_w, exit_r), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, close_fds=True,
            )  # fmt: skip
        except OSError as exc:
            for fd in (ready_r, ready_w, exit_r, exit_w):
                os.close(fd)
            raise SandboxError(f"could not start slirp4netns: {exc}") from exc
        os.close(ready_w)
        os.close(exit_r)
        net = cls(proc, exit_w, subnet)
        try:
            ready, _, _ = select.select([ready_r], [], [], _READY_TIMEOUT_S)
            if not ready or os.read(ready_r, 1) != b"1":
                net.stop(keep_stderr=True)
                stderr = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
                raise SandboxError(f"slirp4netns did not set up the setup network: {stderr or 'no answer'}")
            net._install_routes(pid, allow)
        except BaseException:
            net.stop()
            raise
        finally:
            os.close(ready_r)
        return net

    def _install_routes(self, pid: int, allow: Iterable[str]) -> None:
        gateway = self.subnet.network_address + 2
        allow = list(allow)
        lines = [f"route add prohibit {net}" for net in blocked_routes(host_networks(), allow)]
        lines += [f"route add {ipaddress.IPv4Network(a, strict=False)} via {gateway}" for a in allow]
        proc = subprocess.run(
            [_tool("nsenter"), f"--target={pid}", "--net", _tool("ip"), "-batch", "-"],
            input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if proc.returncode != 0:
            raise SandboxError(f"could not install the setup network's routes: {proc.stderr.strip()}")

    def stop(self, *, keep_stderr: bool = False) -> None:
        """End slirp4netns and wait for it. Idempotent."""
        if self._exit_w is not None:
            os.close(self._exit_w)
            self._exit_w = None
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None and not keep_stderr:
            self.proc.stderr.close()


def _wait_for_loopback(pid: int) -> None:
    """Wait until bubblewrap has brought up the namespace's loopback (its own netlink requests fail when ours
    run at the same time): 127.0.0.1 then has its local route."""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/net/fib_trie") as fh:
                if "127.0.0.1\n" in fh.read():
                    return
        except FileNotFoundError:
            raise SandboxError("the command ended before its network was set up") from None
        except OSError:
            pass
        time.sleep(0.001)
    raise SandboxError("the command's network namespace did not come up")


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if path is None:
        raise ConfigError(
            f"the sandbox's setup network needs `{name}`, which is not installed: {INSTALL_HINT}"
        )
    return path
