"""Sandbox bootstrap: isolates, limits and runs ONE untrusted Python program.

Run by ``sandbox.py`` as ``python -I -S _sandbox_boot.py CONFIG_JSON`` in a new
session, with a minimal environment. Trusted code only up to the ``execve`` of the
program. Standard library only (it runs with ``-S``). Prints one JSON line: the
outcome and the isolation features that were applied.

Layout (``mode`` "root" or "user"):

    caller ── bootstrap (this file; outside the namespaces, enforces the wall clock)
                  └── child = PID 1 of fresh pid/net/mount/ipc/uts namespaces
                        builds a minimal root, pivots into it, drops privileges,
                        sets rlimits, execs the program

The minimal root (``build_root``) is a fresh tmpfs holding read-only bind mounts of the
paths the caller lists (the interpreter, its standard library, the shared libraries it
loads; symlinks on the way are recreated), ``/dev/{null,zero,random,urandom}``, a private
``/tmp`` (the working directory is ``/tmp/work``) and a ``/proc`` of the run's own pid
namespace. After ``pivot_root`` the host's tree is detached: no host file, socket or
device exists for the program. Where any step fails the run is refused (set-up error).

When the child (the namespace's init) exits or is killed, the kernel kills every
other process of its pid namespace (pid_namespaces(7)): a fork bomb or a daemonised
grandchild cannot outlive the run, even one that left the process group.
"""

import ctypes
import json
import os
import resource  # imported before dropping privileges: the interpreter may be unreadable then
import select
import signal
import sys
import time

# <linux/sched.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
# <linux/mount.h>
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
SYS_mount_setattr = 442  # same number on x86_64 and the asm-generic table (aarch64)
MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
MNT_DETACH = 2
# <linux/prctl.h>
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
# pivot_root(2) has no glibc wrapper
SYS_pivot_root = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}.get(os.uname().machine)
DEVICES = ("null", "zero", "random", "urandom")

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


class MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(ret, what):
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def unshare(flags):
    _check(libc.unshare(flags), "unshare")


def mount(src, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _replicate(root, path, depth=0):
    """Make ``path`` resolve inside ``root`` as on the host: each directory of the way made,
    each symlink recreated (and followed), the final file or directory bind-mounted."""
    if depth > 40:
        raise OSError(f"too many symlinks replicating {path}")
    parts = [p for p in path.split("/") if p and p != "."]
    current = "/"
    for i, part in enumerate(parts):
        if part == "..":
            current = os.path.dirname(current.rstrip("/")) or "/"
            continue
        host = os.path.join(current, part)
        inside = root + host
        if os.path.islink(host):
            target = os.readlink(host)
            if not os.path.lexists(inside):
                os.symlink(target, inside)
            absolute = target if target.startswith("/") else os.path.join(current, target)
            rest = "/".join(parts[i + 1 :])
            return _replicate(root, absolute + ("/" + rest if rest else ""), depth + 1)
        if i < len(parts) - 1:
            if not os.path.isdir(inside):
                os.mkdir(inside, 0o755)
            current = host
            continue
        if os.path.ismount(inside) or (os.path.lexists(inside) and not os.path.isdir(host)):
            return  # bound already
        if os.path.isdir(host):
            os.makedirs(inside, 0o755, exist_ok=True)
        else:
            os.close(os.open(inside, os.O_WRONLY | os.O_CREAT, 0o644))  # a mount point for a file
        mount(host, inside, None, MS_BIND | MS_REC)
        return


def _make_read_only(root, binds):
    """Every mount under ``root`` read-only and nosuid (mount_setattr; remounts on older kernels)."""
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    if (
        libc.syscall(SYS_mount_setattr, AT_FDCWD, root.encode(), AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr))
        == 0
    ):
        return
    for target in [root] + binds:  # a bind remount must keep the flags the mount is locked with
        flags = os.statvfs(target).f_flag
        keep = sum(
            ms
            for st, ms in ((os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOSUID, MS_NOSUID))
            if flags & st
        )
        mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | keep)


def build_root(cfg, features):
    """The program's whole filesystem (see the module docstring); returns the root's path."""
    root = cfg["root"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1024k,nr_inodes=4096,mode=0755")
    for path in cfg["binds"]:
        _replicate(root, path)
    for path in cfg.get("hide", []):  # e.g. the interpreter's site-packages: an empty directory instead
        if os.path.isdir(root + path):
            mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, "size=4k,nr_inodes=16,mode=0755")
    for d in ("dev", "tmp", "proc"):
        os.mkdir(os.path.join(root, d), 0o755)
    for name in DEVICES:
        inside = os.path.join(root, "dev", name)
        os.close(os.open(inside, os.O_WRONLY | os.O_CREAT, 0o644))
        mount("/dev/" + name, inside, None, MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, os.path.join(root, "dev", name))
    binds = [line.split()[4] for line in open("/proc/self/mountinfo") if line.split()[4].startswith(root + "/")]
    _make_read_only(root, binds)
    features.append("minimal_root")
    size = f"size={cfg['tmpfs_kb']}k,nr_inodes=4096,mode=1777"
    mount("tmpfs", os.path.join(root, "tmp"), "tmpfs", MS_NOSUID | MS_NODEV, size)
    features.append("private_tmp")
    try:  # before the host's /proc is detached: an unprivileged mount needs it visible (mount_too_revealing)
        mount("proc", os.path.join(root, "proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        features.append("private_proc")
    except OSError:
        pass
    return root


def pivot_into(root):
    """Make ``root`` the filesystem root and detach the host's tree (pivot_root(2), "new_root = put_old")."""
    if SYS_pivot_root is None:
        raise OSError(f"pivot_root: unknown syscall number on {os.uname().machine}")
    os.chdir(root)
    _check(libc.syscall(SYS_pivot_root, b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


def child(cfg, to_parent, from_parent, prog_src, fds, features):
    """Runs as PID 1 of the new namespaces; never returns (execs the program)."""
    mode = cfg["mode"]
    uid, gid = cfg["uid"], cfg["gid"]
    workdir = cfg["workdir"]
    if mode in ("root", "user"):
        # Network, mounts, IPC and hostname are unshared here, not in the bootstrap, so
        # that the bootstrap keeps the host's /proc (it writes this child's id maps).
        unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS)
        features.append("netns")
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the host
        pivot_into(build_root(cfg, features))
        features.append("readonly_root")
        workdir = "/tmp/work"  # in the private /tmp: gone with the namespace
        os.mkdir(workdir, 0o700)
        os.chown(workdir, uid, gid)
        features.append("tmpfs_workdir")
    os.chdir(workdir)
    fd = os.open("prog.py", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, prog_src)
    os.close(fd)
    if os.geteuid() == 0:
        os.chown("prog.py", uid, gid)
    if mode == "root" and cfg.get("child_userns"):
        # A user namespace of its own gives this run its own RLIMIT_NPROC count (the
        # count is per user namespace and uid since Linux 5.14), so concurrent runs
        # as the same uid cannot starve each other. The parent writes the id maps.
        unshare(CLONE_NEWUSER)
        os.write(to_parent, b"M\n")
        if os.read(from_parent, 1) != b"G":
            raise OSError("parent did not map the user namespace")
        features.append("own_userns")
    if os.geteuid() == 0 or mode == "root":
        # Never run the program as root: RLIMIT_NPROC does not apply to root (setrlimit(2)).
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        features.append("setuid")
    mem = cfg["memory_mb"] * 1024 * 1024
    for lim, val in (
        (resource.RLIMIT_CPU, cfg["cpu_s"]),
        (resource.RLIMIT_AS, mem),
        (resource.RLIMIT_NPROC, cfg["nproc"]),
        (resource.RLIMIT_FSIZE, cfg["fsize_mb"] * 1024 * 1024),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, 256),
    ):
        resource.setrlimit(lim, (val, val))
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")  # setuid binaries stay powerless
    # After setuid, which clears the parent-death signal (prctl(2), PR_SET_PDEATHSIG).
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    os.write(to_parent, ("F" + json.dumps(features) + "\n").encode())
    for i, f in enumerate(fds):
        os.dup2(f, i)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    py = cfg["python"]
    os.execve(py, [py, "-I", "-S", "-B", "prog.py"], env)


def main():
    cfg = json.loads(sys.argv[1])
    t0 = time.monotonic()
    deadline = t0 + cfg["timeout_s"]
    with open(cfg["program"], "rb") as f:
        prog_src = f.read()
    fds = [
        os.open(cfg["stdin"] or os.devnull, os.O_RDONLY),
        os.open(cfg["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
        os.open(cfg["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
    ]
    features = _enter_namespaces(cfg)
    c2p_r, c2p_w = os.pipe()  # child -> parent: b"M" (map me), b"E..." error; EOF on exec
    p2c_r, p2c_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(c2p_r)
        os.close(p2c_w)
        _run_child(cfg, c2p_w, p2c_r, prog_src, fds, features)
    os.close(c2p_w)
    os.close(p2c_r)
    for f in fds:
        os.close(f)

    def on_term(signum, frame):
        try:
            os.kill(pid, signal.SIGKILL)
        finally:
            os._exit(3)

    signal.signal(signal.SIGTERM, on_term)
    setup_err, features = _follow_setup(cfg, pid, c2p_r, p2c_w, deadline, features)
    status = _wait_until(pid, deadline)
    elapsed = time.monotonic() - t0
    if status is None:
        os.kill(pid, signal.SIGKILL)  # the namespace's init: takes every descendant with it
        os.waitpid(pid, 0)
        out = {"status": "timeout"}
    elif setup_err is not None:
        out = {"status": "setup_error", "error": setup_err["error"]}
    elif os.WIFSIGNALED(status):
        out = {"status": "signal", "signal": os.WTERMSIG(status)}
    else:
        out = {"status": "exit", "code": os.WEXITSTATUS(status)}
    out["elapsed"] = round(elapsed, 4)
    out["features"] = features
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


def _enter_namespaces(cfg: dict) -> list[str]:
    """Unshare the pid namespace (and the user namespace when unprivileged); the features applied so far."""
    mode = cfg["mode"]
    if mode == "root":
        unshare(CLONE_NEWPID)  # the next child is PID 1 of a new pid namespace
    elif mode == "user":
        uid, gid = os.getuid(), os.getgid()
        unshare(CLONE_NEWUSER | CLONE_NEWPID)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        cfg["uid"], cfg["gid"] = uid, gid
    return ["pidns"] if mode != "none" else []


def _run_child(cfg: dict, c2p_w: int, p2c_r: int, prog_src: bytes, fds: list[int], features: list[str]) -> None:
    """In the forked child: isolate and exec the program; never returns."""
    try:
        child(cfg, c2p_w, p2c_r, prog_src, fds, features)
    except BaseException as e:  # report set-up failures, never run the program half-isolated
        try:
            os.write(
                c2p_w,
                ("E" + json.dumps({"error": f"{type(e).__name__}: {e}", "features": features}) + "\n").encode(),
            )
        finally:
            os._exit(127)
    os._exit(127)


def _follow_setup(cfg: dict, pid: int, c2p_r: int, p2c_w: int, deadline: float, features: list[str]):
    """Read the set-up channel, one message per line: "M" (map my user namespace), "F<json>" (features
    applied), "E<json>" (set-up failed). EOF means the exec happened. Returns (set-up error or None, features)."""
    setup_err = None
    buf = b""
    eof = False
    while not eof:
        r, _, _ = select.select([c2p_r], [], [], max(0.0, deadline - time.monotonic()))
        if not r:
            break
        chunk = os.read(c2p_r, 65536)
        eof = not chunk
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line == b"M":
                _write(f"/proc/{pid}/uid_map", f"{cfg['uid']} {cfg['uid']} 1")
                _write(f"/proc/{pid}/gid_map", f"{cfg['gid']} {cfg['gid']} 1")
                os.write(p2c_w, b"G")
            elif line.startswith(b"F"):
                features = json.loads(line[1:].decode())
            elif line.startswith(b"E"):
                setup_err = json.loads(line[1:].decode())
                features = setup_err["features"]
    return setup_err, features


def _wait_until(pid: int, deadline: float) -> int | None:
    """The program's wait status, or None when the wall-clock deadline passed first."""
    status = None
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    while status is None:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if pidfd is not None:
            select.select([pidfd], [], [], left)
        else:
            time.sleep(min(left, 0.01))
        wpid, st = os.waitpid(pid, os.WNOHANG)
        if wpid == pid:
            status = st
    return status


if __name__ == "__main__":
    main()
