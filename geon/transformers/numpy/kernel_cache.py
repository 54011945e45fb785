"""The folder compiled kernels are kept in (``$GEON_CACHE_DIR/kernels``), opened once
and checked through its descriptor, and the error every step of the compiled path
raises (:class:`CompileError`). See :mod:`geon.transformers.numpy.compiled`, "Cache"."""

import errno
import os
import secrets
import stat


class CompileError(Exception):
    """The compiled path cannot be used (no compiler, compilation failed, ...);
    ``key`` names the cause (one warning per cause)."""

    def __init__(self, message, key=None):
        super().__init__(message)
        self.key = key or message



def cache_dir():
    """Where compiled kernels are kept: ``$GEON_CACHE_DIR/kernels``, default
    ``~/.cache/geon/kernels``."""
    root = os.environ.get("GEON_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "geon")
    return os.path.join(root, "kernels")


#: Where this process's open descriptors have paths (Linux): ``/proc/self/fd/N`` is
#: the folder opened as N, whatever its old path names by now.
_PROC_FD = "/proc/self/fd"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _fresh(prefix, suffix=""):
    """A name never used before (for files made with O_EXCL)."""
    return f"{prefix}{secrets.token_hex(8)}{suffix}"


def _mine(st, strict=True):
    """Whether ``st`` is this user's, and (``strict``) writable by no one else."""
    return st.st_uid == os.getuid() and not (strict and st.st_mode & 0o022)


class Folder:
    """A folder opened once and checked through its descriptor (:func:`open_folder`).

    Every later open, write, rename and removal in it is relative to that descriptor
    (``dir_fd``, never following a symbolic link), and the compiler and the loader
    reach it by :meth:`at`, so a folder swapped in under its path after the check
    (by anyone who may write to the folder above) is never read or written. Close it
    after use (or use ``with``)."""

    def __init__(self, fd, path):
        self.fd, self.path = fd, path
        self.via_fd = os.path.isdir(_PROC_FD)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _dir(self):
        """The descriptor to open relative to; an error once closed (``dir_fd=None``
        would name the working directory instead)."""
        if self.fd is None:
            raise OSError(f"the cache folder {self.path} was closed")
        return self.fd

    def at(self, name=""):
        """A path naming ``name`` in this folder: through the descriptor
        (``/proc/self/fd/N/name``) where the system has such paths, else through the
        folder's path (then checked from the root: see :func:`open_folder`)."""
        base = f"{_PROC_FD}/{self.fd}" if self.via_fd else self.path
        return os.path.join(base, name) if name else base

    def pass_fds(self):
        """The descriptors a child process needs to reach :meth:`at`."""
        return (self.fd,) if self.via_fd else ()

    def read(self, name, strict=True):
        """The bytes of the file ``name``, read through one descriptor; None where it is
        missing or not a regular file of this user's (``strict``: that no one else may
        write)."""
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=self._dir())
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not _mine(st, strict):
                return None
            return f.read()

    def write_new(self, name, data, mode=0o600):
        """Write ``data`` to a new file ``name`` (which must not exist)."""
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode,
                     dir_fd=self._dir())
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def write_atomic(self, name, data):
        """Write ``data`` to ``name`` under a fresh name, then rename it: a reader sees
        the old file or the whole new one."""
        tmp = _fresh(".tmp-", "-" + name)
        try:
            self.write_new(tmp, data)
            os.replace(tmp, name, src_dir_fd=self._dir(), dst_dir_fd=self._dir())
        except BaseException:
            self.unlink(tmp)
            raise

    def unlink(self, name):
        """Remove the file ``name`` if it is there."""
        try:
            os.unlink(name, dir_fd=self._dir())
        except FileNotFoundError:
            pass


def open_folder(d, make=False):
    """The folder ``d`` (made readable by its owner only if ``make`` and it is missing)
    as a :class:`Folder`, after checking through its descriptor that libraries may be
    loaded from it: a real folder (not a symbolic link), this user's, writable by no
    one else, who could otherwise put code there that geon would run. Where the system
    cannot name a descriptor as a path (no ``/proc/self/fd``), every folder above it
    must be this user's or root's and writable by no one else (or sticky, as /tmp),
    so that its path keeps naming it. Raises :class:`CompileError` (cause "no
    cache")."""
    if not hasattr(os, "getuid") or os.open not in os.supports_dir_fd:
        raise CompileError("no kernel cache on this system: it cannot open files "
                           "relative to a folder", key="no cache")
    try:
        if make:
            os.makedirs(os.path.dirname(d), exist_ok=True)
            try:
                os.mkdir(d, 0o700)
            except FileExistsError:
                pass
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW)
    except OSError as e:
        why = ("it is a symbolic link (set GEON_CACHE_DIR to the folder it points to)"
               if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(d) else e)
        raise CompileError(f"cannot create the kernel cache {d}: {why}",
                           key="no cache") from None
    folder = Folder(fd, d)
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode) or not _mine(st):
            raise CompileError(f"the kernel cache {d} belongs to another user or "
                               f"others may write to it: no library is loaded from it "
                               f"(set GEON_CACHE_DIR to a folder of your own)",
                               key="no cache")
        if not folder.via_fd:
            folder.path = _check_path(d, st)
        if not os.access(folder.at(), os.W_OK | os.X_OK):
            raise CompileError(f"cannot write to the kernel cache {d}", key="no cache")
    except BaseException:
        folder.close()
        raise
    return folder


def changeable_by_others(real):
    """The first folder above the real path ``real`` that a user other than root and
    this one may change (owned by another, or writable by group or others without the
    sticky bit), or None: what a library is loaded from must be no one else's."""
    parts = real.split(os.sep)
    for k in range(1, len(parts)):
        above = os.sep.join(parts[:k]) or os.sep
        s = os.stat(above)
        if s.st_uid not in (0, os.getuid()) or (s.st_mode & 0o022
                                                 and not s.st_mode & stat.S_ISVTX):
            return above
    return None


def _check_path(d, st):
    """The real path of the folder ``d`` opened with status ``st``, where no other user
    can change what it names (see :func:`open_folder`)."""
    real = os.path.realpath(d)
    above = changeable_by_others(real)
    if above is not None:
        raise CompileError(f"others may change the folder {above} above the "
                           f"kernel cache {d}: no library is loaded from it (set "
                           f"GEON_CACHE_DIR to a folder of your own)",
                           key="no cache")
    s = os.stat(real)
    if (s.st_dev, s.st_ino) != (st.st_dev, st.st_ino):
        raise CompileError(f"the kernel cache {d} was moved while it was checked",
                           key="no cache")
    return real


def open_cache():
    """The kernel cache (:func:`cache_dir`) as a checked :class:`Folder`, made if
    missing; raises :class:`CompileError` (cause "no cache")."""
    return open_folder(cache_dir(), make=True)

