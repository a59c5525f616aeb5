"""The seccomp filter every locally sandboxed process runs under.

The filter allows everything except the system calls a test suite never needs and a kernel exploit often does.
Each denied call fails with EPERM (a program sees "Operation not permitted" and can carry on), except `clone3`,
which fails with ENOSYS so that the C library falls back to `clone`, whose flags the filter can see (clone3
passes them in memory a seccomp filter cannot read). The filter is compiled by libseccomp (through the
`pyseccomp` ctypes binding, PyPI) for x86-64 together with its 32-bit ABIs, so `int 0x80` and x32 calls meet
the same rules; any other ABI is killed.

bubblewrap loads it (`--seccomp FD`) right before it executes the command, so bubblewrap's own setup is not
filtered and every process of the command is: a filter is inherited across fork and exec and cannot be removed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from typing import Any

from bugsweep.errors import ConfigError

log = logging.getLogger(__name__)

#: System call -> why a sandboxed test suite is denied it. Names the kernel does not know on an ABI are skipped.
DENIED_SYSCALLS: dict[str, str] = {
    # Kernel keyrings: shared across the whole machine per user, and a frequent source of kernel bugs.
    "add_key": "kernel keyrings", "keyctl": "kernel keyrings", "request_key": "kernel keyrings",
    # Looking into or taking over other processes.
    "ptrace": "tracing processes", "process_vm_readv": "other processes' memory",
    "process_vm_writev": "other processes' memory", "pidfd_getfd": "other processes' files",
    "kcmp": "comparing other processes' kernel state",
    # Kernel modules and replacing the kernel.
    "init_module": "kernel modules", "finit_module": "kernel modules", "delete_module": "kernel modules",
    "create_module": "kernel modules", "kexec_load": "kexec", "kexec_file_load": "kexec", "reboot": "reboot",
    # Mounts and namespaces: the sandbox's file system view is bubblewrap's to make, not the command's.
    "mount": "mounts", "umount": "mounts", "umount2": "mounts", "pivot_root": "mounts", "chroot": "mounts",
    "open_tree": "mounts", "move_mount": "mounts", "fsopen": "mounts", "fsconfig": "mounts", "fsmount": "mounts",
    "fspick": "mounts", "mount_setattr": "mounts", "unshare": "namespaces", "setns": "namespaces",
    # Kernel tracing and programmability.
    "bpf": "eBPF", "perf_event_open": "perf events", "userfaultfd": "userfaultfd (exploit primitive)",
    "io_uring_setup": "io_uring", "io_uring_enter": "io_uring", "io_uring_register": "io_uring",
    "lookup_dcookie": "kernel profiling", "fanotify_init": "file system monitoring of the whole mount",
    # Machine-wide state.
    "swapon": "swap", "swapoff": "swap", "acct": "process accounting", "quotactl": "disk quotas",
    "quotactl_fd": "disk quotas", "settimeofday": "the clock", "clock_settime": "the clock",
    "clock_adjtime": "the clock", "adjtimex": "the clock", "stime": "the clock", "syslog": "the kernel log",
    "sethostname": "host name", "setdomainname": "host name", "vhangup": "terminals",
    "open_by_handle_at": "opening files by handle (escapes bind mounts)", "nfsservctl": "NFS server",
    "iopl": "I/O ports", "ioperm": "I/O ports", "uselib": "obsolete", "vm86": "obsolete", "vm86old": "obsolete",
    "_sysctl": "obsolete", "ustat": "obsolete", "sysfs": "obsolete", "get_kernel_syms": "obsolete",
    "query_module": "obsolete", "afs_syscall": "unimplemented", "tuxcall": "unimplemented",
    "security": "unimplemented",
}  # fmt: skip

#: clone() flags that make new namespaces; a clone with any of them fails (the sandbox has no capabilities, so
#: the kernel would refuse most of them anyway; the filter refuses them before the kernel's namespace code runs).
CLONE_NAMESPACE_FLAGS = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
    | 0x00000080  # CLONE_NEWTIME
)

INSTALL_HINT = (
    "the sandbox's system call filter needs libseccomp and its Python binding: `apt-get install libseccomp2` "
    "and `pip install pyseccomp` (part of bugsweep's `local` extra)"
)

_lock = threading.Lock()
_program: bytes | None = None


def filter_program() -> bytes:
    """The compiled BPF program (built once per process). Raises ConfigError when libseccomp is missing."""
    global _program
    with _lock:
        if _program is None:
            _program = _build()
        return _program


def filter_fd() -> int:
    """A new file descriptor holding the program at offset 0, for one `bwrap --seccomp FD` (bubblewrap reads
    it to the end, so each command needs its own). The caller closes it."""
    program = filter_program()
    fd = os.memfd_create("bugsweep-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _build() -> bytes:
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as exc:  # OSError: the binding is there, libseccomp.so.2 is not
        raise ConfigError(f"{INSTALL_HINT} ({exc})") from None
    deny = sc.ERRNO(errno.EPERM)
    filt = sc.SyscallFilter(sc.ALLOW)
    for arch in (sc.Arch.X86, sc.Arch.X32):  # the native ABI is in the filter already
        with contextlib.suppress(OSError, ValueError):  # not an ABI of this machine's architecture
            filt.add_arch(arch)
    for name in DENIED_SYSCALLS:
        _add(filt, deny, name)
    for flag in _bits(
        CLONE_NAMESPACE_FLAGS
    ):  # "flags & NEW* != 0", one rule per flag (rules of one action OR)
        _add(filt, deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    _add(filt, sc.ERRNO(errno.ENOSYS), "clone3")
    fd = os.memfd_create("bugsweep-seccomp-build", os.MFD_CLOEXEC)
    with os.fdopen(fd, "w+b") as out:
        filt.export_bpf(out)
        out.seek(0)
        return out.read()


def _bits(mask: int) -> list[int]:
    return [1 << i for i in range(mask.bit_length()) if mask & (1 << i)]


def _add(filt: Any, action: int, name: str, *args: Any) -> None:
    try:
        filt.add_rule(action, name, *args)
    except (OSError, ValueError, RuntimeError) as exc:  # a name this libseccomp or architecture does not know
        log.debug("seccomp: %s not filtered: %s", name, exc)
