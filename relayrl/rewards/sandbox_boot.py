"""The sandbox's first process (``rewards.sandbox``): run as a program by ``python -I -S``, never imported.

It dies with the reward worker that started it (PDEATHSIG) and moves the passed descriptors to their
numbers. Level 1: set rlimits, drop to the sandbox uid where allowed, guard sockets, run main.py.
Level 2: unshare pid/net, fork the namespace's init, which unshares mounts, builds the allowlist root,
pivots into it, drops to the sandbox uid, enters a new user namespace and execs the interpreter on
main.py; this process waits for it and exits with its status. ``argv[1]`` is the JSON the parent built.
"""

import ctypes
import fcntl
import json
import os
import resource
import select
import shutil
import signal
import sys
from collections.abc import Iterator
from typing import NoReturn

a = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the reward worker
if os.getppid() != a["parent"]:  # it died before the line above
    os._exit(137)
high = {int(t): fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for t, fd in a["fds"].items()}
for fd in a["fds"].values():  # above the targets first: a source may be a target's number
    os.close(fd)
for target, fd in high.items():
    os.dup2(fd, target)
    os.close(fd)


def limits(nproc: int) -> None:
    pairs = [
        (resource.RLIMIT_AS, a["mem"]),
        (resource.RLIMIT_CPU, a["cpu"]),
        (resource.RLIMIT_FSIZE, a["fsize"]),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, 256),
    ]
    for limit, value in pairs + ([(resource.RLIMIT_NPROC, nproc)] if nproc else []):
        resource.setrlimit(limit, (value, value))


def drop_to(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


if a["level"] == 1:
    if a["drop"]:
        drop_to(a["uid"])
    limits(a["nproc"] if a["drop"] else 0)
    import runpy
    import socket

    def _no_network(*args: object, **kwargs: object) -> NoReturn:
        raise PermissionError("network access is disabled in the relayrl sandbox")

    class _NoSocket(socket.socket):
        def __init__(self, *args: object, **kwargs: object) -> None:
            _no_network()

    socket.socket = _NoSocket  # type: ignore[misc]  # the guard replaces the class
    socket.create_connection = socket.getaddrinfo = socket.socketpair = socket.fromfd = _no_network
    sys.argv = [a["main"]]
    del a, limits, ctypes, fcntl, json, resource, select, signal, libc, high, drop_to
    runpy.run_path(sys.argv[0], run_name="__main__")
    sys.exit(0)

NS, USER, PID, NET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}[os.uname().machine]


def check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    check(libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def bind(src: str, new: str) -> None:
    target = new + src
    if os.path.isdir(src):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w"):
            pass
    mount(src, target, None, BIND | REC)


def mount_points() -> Iterator[str]:
    with open("/proc/self/mountinfo") as info:
        lines = info.readlines()
    for line in lines:
        point = line.split()[4]
        yield point.encode().decode("unicode_escape") if "\\" in point else point


def allowlist_root() -> None:
    check(libc.unshare(NS), "unshare mount")
    mount(None, "/", None, REC | PRIVATE)
    new = a["newroot"]
    mount("tmpfs", new, "tmpfs", NOSUID | NODEV, "size=1m,mode=755")
    for path, target in a["links"]:
        os.makedirs(os.path.dirname(new + path), exist_ok=True)
        os.symlink(target, new + path)
    for path in a["binds"] + a["devices"]:
        bind(path, new)
    for path in a["masks"]:
        mount("tmpfs", new + path, "tmpfs", NOSUID | NODEV | RDONLY, "size=4k,mode=555")
    box = new + "/tmp/box"
    os.makedirs(box)
    mount("tmpfs", box, "tmpfs", NOSUID | NODEV, f"size={a['disk_mb']}m,mode=700,uid={a['uid']},gid={a['uid']}")
    for name in os.listdir(a["box"]):
        shutil.copyfile(os.path.join(a["box"], name), os.path.join(box, name))
        os.chown(os.path.join(box, name), a["uid"], a["uid"])
    os.makedirs(new + "/proc")
    mount("proc", new + "/proc", "proc", NOSUID | NODEV | NOEXEC)
    os.makedirs(new + "/.old")
    check(libc.syscall(PIVOT_ROOT, new.encode(), (new + "/.old").encode()), "pivot_root")
    os.chdir("/")
    check(libc.umount2(b"/.old", 2), "umount old root")  # MNT_DETACH: the trainer's tree is gone
    os.rmdir("/.old")
    for point in mount_points():
        if point in ("/proc", "/tmp/box") or point.startswith("/proc/"):
            continue
        flags = REMOUNT | BIND | NOSUID | RDONLY | (0 if point.startswith("/dev/") else NODEV)
        mount(None, point, None, flags if point != "/" else REMOUNT | NOSUID | NODEV | RDONLY)


def become_sandbox_user() -> None:
    drop_to(a["uid"])
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: own /proc/self/*_map again
    check(libc.unshare(USER), "unshare user")
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{a['uid']} {a['uid']} 1"),
        ("gid_map", f"{a['uid']} {a['uid']} 1"),
    ):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def init(alive: int) -> None:
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG (cleared by setuid: set again below)
    allowlist_root()
    os.chdir("/tmp/box")
    become_sandbox_user()
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)
    if select.select([alive], [], [], 0)[0]:  # the boot process died before PDEATHSIG was set again
        os._exit(137)
    os.close(alive)
    limits(a["nproc"])
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp/box", "TMPDIR": "/tmp/box", "LANG": "C.UTF-8"}
    os.execve(a["python"], ["python", "-I", "-S", "main.py"], env)


check(libc.unshare(PID | NET), "unshare pid/net")  # the mount namespace is the init's own (below)
alive_r, alive_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(alive_w)
    try:
        init(alive_r)
    except BaseException as exc:  # noqa: BLE001 - any failure of the set-up ends the init with one line
        os.write(2, f"relayrl sandbox setup failed: {exc}\n".encode())
        os._exit(125)
os.close(alive_r)
for target in high:
    os.close(target)  # only the init holds the pipes: EOF when it dies
with open(f"/proc/{pid}/stat") as stat:
    start = stat.read().rsplit(")", 1)[1].split()[19]
with open(a["init_pid"], "w") as f:  # pid and start time: the parent waits for this init
    f.write(f"{pid} {start}")
status = os.waitpid(pid, 0)[1]
os.truncate(a["init_pid"], 0)  # reaped: the pid may be reused, nothing to wait for
sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
