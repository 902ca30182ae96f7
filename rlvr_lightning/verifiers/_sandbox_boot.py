"""Sandbox bootstrap: isolates, limits and runs ONE untrusted Python program.

Run by ``sandbox.py`` as ``python -I -S _sandbox_boot.py CONFIG_JSON`` in a new
session, with a minimal environment. Trusted code only up to the ``execve`` of the
program. Standard library only (it runs with ``-S``). Prints one JSON line: the
outcome and the isolation features that were applied.

Layout (``mode`` "root" or "user"):

    caller ── bootstrap (this file; outside the namespaces, enforces the wall clock)
                  └── child = PID 1 of fresh pid/net/mount/ipc/uts namespaces
                        mounts, drops privileges, sets rlimits, execs the program

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
# <linux/prctl.h>
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


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


def child(cfg, to_parent, from_parent, prog_src, fds, features):
    """Runs as PID 1 of the new namespaces; never returns (execs the program)."""
    mode = cfg["mode"]
    uid, gid = cfg["uid"], cfg["gid"]
    workdir = cfg["workdir"]
    size = "size=%dk,nr_inodes=%d" % (cfg["tmpfs_kb"], 4096)
    if mode in ("root", "user"):
        # Network, mounts, IPC and hostname are unshared here, not in the bootstrap, so
        # that the bootstrap keeps the host's /proc (it writes this child's id maps).
        unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS)
        features.append("netns")
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the host
        attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
        if libc.syscall(SYS_mount_setattr, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr),
                        ctypes.sizeof(attr)) == 0:
            features.append("readonly_root")  # every existing mount, recursively
        private_tmp = 0
        for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
            if os.path.isdir(d) and not os.path.islink(d):
                try:
                    mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=1777")
                    private_tmp += d == "/tmp"
                except OSError:
                    pass
        if private_tmp:
            features.append("private_tmp")
            # The working directory lives in the private /tmp: gone with the namespace.
            workdir = "/tmp/work"
            os.mkdir(workdir, 0o700)
            os.chown(workdir, uid, gid)
        else:
            owner = ",uid=%d,gid=%d" % (uid, gid)
            mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=0700" + owner)
        features.append("tmpfs_workdir")
        try:  # only this pid namespace's processes are visible (no host /proc/*/environ)
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            features.append("private_proc")
        except OSError:
            pass
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
    for lim, val in ((resource.RLIMIT_CPU, cfg["cpu_s"]), (resource.RLIMIT_AS, mem),
                     (resource.RLIMIT_NPROC, cfg["nproc"]), (resource.RLIMIT_FSIZE, cfg["fsize_mb"] * 1024 * 1024),
                     (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, 256)):
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
    features = []
    t0 = time.monotonic()
    deadline = t0 + cfg["timeout_s"]
    with open(cfg["program"], "rb") as f:
        prog_src = f.read()
    fds = [os.open(cfg["stdin"] or os.devnull, os.O_RDONLY),
           os.open(cfg["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
           os.open(cfg["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)]
    mode = cfg["mode"]
    if mode == "root":
        unshare(CLONE_NEWPID)  # the next child is PID 1 of a new pid namespace
    elif mode == "user":
        uid, gid = os.getuid(), os.getgid()
        unshare(CLONE_NEWUSER | CLONE_NEWPID)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", "%d %d 1" % (uid, uid))
        _write("/proc/self/gid_map", "%d %d 1" % (gid, gid))
        cfg["uid"], cfg["gid"] = uid, gid
    if mode != "none":
        features.append("pidns")
    c2p_r, c2p_w = os.pipe()  # child -> parent: b"M" (map me), b"E..." error; EOF on exec
    p2c_r, p2c_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(c2p_r)
        os.close(p2c_w)
        try:
            child(cfg, c2p_w, p2c_r, prog_src, fds, features)
        except BaseException as e:  # report set-up failures, never run the program half-isolated
            try:
                os.write(c2p_w, ("E" + json.dumps({"error": "%s: %s" % (type(e).__name__, e),
                                                    "features": features}) + "\n").encode())
            finally:
                os._exit(127)
        os._exit(127)
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
    # Set-up channel, one message per line: "M" (map my user namespace), "F<json>"
    # (features applied), "E<json>" (set-up failed). EOF means the exec happened.
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
                _write("/proc/%d/uid_map" % pid, "%d %d 1" % (cfg["uid"], cfg["uid"]))
                _write("/proc/%d/gid_map" % pid, "%d %d 1" % (cfg["gid"], cfg["gid"]))
                os.write(p2c_w, b"G")
            elif line.startswith(b"F"):
                features = json.loads(line[1:].decode())
            elif line.startswith(b"E"):
                setup_err = json.loads(line[1:].decode())
                features = setup_err["features"]
    # Wait for the program with the wall-clock deadline.
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


if __name__ == "__main__":
    main()
