"""Checkpoint files: what :meth:`Transformer.save` writes and ``restore`` reads.

A checkpoint is a zip archive that NumPy opens as an ``.npz`` file. It holds one
``.npy`` member per variable, named by position (``arr_0.npy``, ``arr_1.npy``, ...), and
a manifest ``geon-checkpoint.json``::

    {"format": "geon-checkpoint", "version": 1,
     "variables": [{"name": "w", "member": "arr_0.npy", "dtype": "<f4", "shape": [4, 2],
                    "crc32": 1234567890}, ...]}

Variable names live only in the (ASCII-escaped) manifest, so no name ever becomes a
keyword argument, a file path or a zip member name: any name round-trips. ``crc32`` is
the member's CRC-32 as the zip directory records it: members swapped or replaced inside
the archive do not match their manifest entry. An archive
without a manifest whose members are ``<name>.npy`` (what ``np.savez(path, **arrays)``
writes) is read too, each member standing for the variable of its name.

Reading validates before it allocates. The zip directory, the manifest and each
member's ``.npy`` header are checked against the variables the transformer expects,
with every read bounded by what a checkpoint of those variables can need; only then is
each array read, into a new buffer of the expected size, never decompressing more than
that. Anything wrong raises :class:`~geon.errors.CheckpointError`. Nothing is unpickled.

Writing is atomic: a temporary file beside the target (created with the process's
umask, as any new file), flushed and fsynced, then renamed over the target. Temporary
files that a killed writer left behind are removed by the next save to that folder.
"""

import contextlib
import hashlib
import io
import json
import os
import re
import secrets
import socket
import struct
import time
import zipfile
import zlib

import numpy as np

from geon.errors import CheckpointError

MANIFEST = "geon-checkpoint.json"
FORMAT = "geon-checkpoint"
VERSION = 1
TEMP_PREFIX, TEMP_SUFFIX = ".geon-ckpt-", ".tmp"
#: A temporary file untouched this long is a leftover even if its writer's pid lives
#: (pids are reused; a writer on another host has another pid space).
STALE_SECONDS = 15 * 60
#: The largest ``.npy`` header read (NumPy's own default limit).
MAX_NPY_HEADER = 10000
_CHUNK = 1 << 20
# Temporary names carry a token of the host and the writer's pid, so that a later save
# can tell a dead writer's leftover from a live writer's file.
_HOST = hashlib.blake2s(socket.gethostname().encode("utf-8", "replace"),
                        digest_size=4).hexdigest()
_TEMP_NAME = re.compile(r"\.geon-ckpt-([0-9a-f]{8})-([0-9]+)-[0-9a-f]+\.tmp\Z")
# What a damaged archive makes zipfile, zlib and the .npy header parser raise.
_READ_ERRORS = (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error,
                struct.error, NotImplementedError, RuntimeError, OverflowError,
                UnicodeError, KeyError, TypeError)


def member_name(i):
    """The archive member holding the ``i``-th variable."""
    return f"arr_{i}.npy"


def manifest_form(name):
    """``name`` as the manifest gives it back. JSON escapes each UTF-16 surrogate on
    its own and a reader joins a high and a low one into one character, so a name
    holding such a pair of lone surrogates comes back as that character; every other
    name comes back as it is."""
    return json.loads(json.dumps(name, ensure_ascii=True))


# --- writing ---------------------------------------------------------------------------

def write(path, arrays):
    """Write ``arrays`` (a list of ``(name, array)``) as a checkpoint at ``path``,
    atomically; an ``OSError`` becomes a :class:`CheckpointError` naming ``path``."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CheckpointError(f"cannot save checkpoint {path}: {folder} is not an "
                              f"existing folder")
    forms = {}
    for name, _ in arrays:
        other = forms.setdefault(manifest_form(name), name)
        if other != name:
            raise CheckpointError(
                f"cannot save checkpoint {path}: variables {other!r} and {name!r} differ "
                f"only in how UTF-16 surrogates are paired, which a checkpoint's manifest "
                f"cannot tell apart; rename one of them")
    try:
        write_atomically(path, lambda f: _write_archive(f, arrays))
    except OSError as e:
        raise CheckpointError(f"cannot save checkpoint {path}: {e}") from e


def write_atomically(path, write):
    """Make the file ``path`` by ``write(f)`` (``f``: a binary file) as checkpoints are
    made: into a temporary file beside it, created with the process's umask like any
    new file, flushed and fsynced, then renamed over ``path`` (and the folder synced),
    so a reader sees the old file or the whole new one, never a part. Temporary files
    a killed writer left in the folder are removed first; an ``OSError`` propagates
    and leaves ``path`` as it was."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    remove_stale_temps(folder)
    tmp = None
    try:
        fd, tmp = _create_temp(folder)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        _sync_folder(folder)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _write_archive(f, arrays):
    variables = []
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for i, (name, a) in enumerate(arrays):
            member = member_name(i)
            with z.open(member, "w", force_zip64=True) as m:
                np.lib.format.write_array(m, np.asarray(a, order="C"),
                                          allow_pickle=False)
            variables.append({"name": name, "member": member, "dtype": a.dtype.str,
                              "shape": list(a.shape), "crc32": z.getinfo(member).CRC})
        manifest = {"format": FORMAT, "version": VERSION, "variables": variables}
        z.writestr(MANIFEST, json.dumps(manifest, ensure_ascii=True, indent=1))


def _create_temp(folder):
    # os.open with mode 0o666 lets the umask (and default ACLs) decide the permissions,
    # as for any file the user creates; O_EXCL never follows or reuses an existing name.
    flags = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
             | getattr(os, "O_CLOEXEC", 0))
    while True:
        tmp = os.path.join(folder, f"{TEMP_PREFIX}{_HOST}-{os.getpid()}-"
                                   f"{secrets.token_hex(6)}{TEMP_SUFFIX}")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue


def _sync_folder(folder):
    # Makes the rename durable; not every platform can open a folder.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temps(folder, now=None):
    """Remove the temporary files of interrupted saves in ``folder``: regular files of
    this user named like ours whose writer (on this host) is dead, or that nobody has
    written for :data:`STALE_SECONDS`. A live writer's file is left alone."""
    now = time.time() if now is None else now
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    uid = os.getuid() if hasattr(os, "getuid") else None
    for e in entries:
        if not (e.name.startswith(TEMP_PREFIX) and e.name.endswith(TEMP_SUFFIX)):
            continue
        try:
            if not e.is_file(follow_symlinks=False):
                continue
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if uid is not None and st.st_uid != uid:
            continue
        m = _TEMP_NAME.match(e.name)
        dead = m is not None and m[1] == _HOST and not _alive(int(m[2]))
        if dead or now - st.st_mtime > STALE_SECONDS:
            with contextlib.suppress(OSError):
                os.unlink(e.path)


def _alive(pid):
    if pid == os.getpid():
        return True
    if os.name != "posix":  # no signal 0 to probe with: rely on the age
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # e.g. another user's process
        return True
    return True


# --- reading ---------------------------------------------------------------------------

class _Invalid(Exception):
    """A checkpoint that does not fit the variables (the message says why)."""


def read(path, expected):
    """``{name: array}`` read from the checkpoint at ``path``, which must hold exactly
    the variables ``expected`` (``{name: (shape, dtype)}``); every array is new.

    Raises :class:`CheckpointError` for a missing, unreadable, corrupt or mismatched
    file, having allocated no more than the expected arrays need.
    """
    path = os.fspath(path)
    expected = {n: (tuple(shape), np.dtype(dt)) for n, (shape, dt) in expected.items()}
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: {e}") from None
    with f:
        try:
            return _read(f, expected)
        except _Invalid as e:
            raise CheckpointError(f"checkpoint {path} {e}") from None
        except _READ_ERRORS as e:
            raise CheckpointError(f"checkpoint {path} is unreadable: "
                                  f"{type(e).__name__}: {e}") from None


def _read(f, expected):
    _check_directory(f, expected)
    with zipfile.ZipFile(f) as z:
        infos = z.infolist()
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            raise _Invalid("has two members of the same name")
        for i in infos:
            if i.flag_bits & 1:
                raise _Invalid(f"has an encrypted member {i.filename!r}")
            if i.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise _Invalid(f"member {i.filename!r} uses compression method "
                               f"{i.compress_type}; only stored and deflated members "
                               f"are read")
        if MANIFEST in names:
            members = _read_manifest(z, expected)
            unused = set(names) - set(members.values()) - {MANIFEST}
            if unused:
                raise _Invalid(f"has members its manifest does not list: "
                               f"{_some(sorted(unused))}")
        else:
            odd = [n for n in names if not n.endswith(".npy")]
            if odd:
                raise _Invalid(f"is not a checkpoint: member(s) {_some(odd)} are not "
                               f".npy arrays and there is no {MANIFEST}")
            members = {n[:-4]: n for n in names}
        _check_names(members, expected)
        # Every header first: nothing is allocated for a file that does not fit.
        for name, member in members.items():
            with z.open(member) as m:
                _check_header(m, name, member, expected[name])
        loaded = {}
        for name, member in members.items():
            with z.open(member) as m:
                fortran = _check_header(m, name, member, expected[name])
                loaded[name] = _read_array(m, member, *expected[name], fortran)
        return loaded


def _check_directory(f, expected):
    """Bound the zip directory that zipfile is about to read (it reads the size the
    end record declares, and builds an object per entry) by what a checkpoint of the
    expected variables has. Also gives clear messages for files that are no zip."""
    size = os.fstat(f.fileno()).st_size
    head = f.read(6)
    if head == b"\x93NUMPY":
        raise _Invalid("is a single .npy array, not a checkpoint (a zip archive of "
                       "arrays, as save() writes)")
    f.seek(max(0, size - 98))
    tail = f.read(98)
    f.seek(0)
    end = tail[-22:]
    if len(end) < 22 or end[:4] != b"PK\x05\x06":
        raise _Invalid("is not a checkpoint: no zip directory at its end (a checkpoint "
                       "is a zip archive without a comment, as save() writes)")
    if end[20:22] != b"\0\0":
        raise _Invalid("has a zip archive comment; checkpoints have none")
    # zipfile takes the size from the zip64 end record right before the locator when
    # there is one (the end record may then hold 0xFFFFFFFF), else from the end record.
    if len(tail) == 98 and tail[-42:-38] == b"PK\x06\x07" and tail[:4] == b"PK\x06\x06":
        declared, start = struct.unpack("<QQ", tail[40:56])
    else:
        declared, start = struct.unpack("<II", end[12:20])
    room = 46 + 128 + len(MANIFEST)  # fixed part, extra fields, name
    for i, name in enumerate(expected):
        room += 46 + 128 + max(len(member_name(i)), len(name.encode("utf-8", "replace")) + 4)
    if declared > room:
        # More members than these variables: most likely the checkpoint of a larger
        # model. Name the variables that differ, reading a bounded part of the file.
        try:
            told = _larger_archive(f, expected, declared, start, room)
        except _READ_ERRORS + (RecursionError,):  # (a manifest nested too deep)
            told = None
        f.seek(0)
        raise _Invalid(told or f"declares a zip directory of {declared} bytes; one of "
                               f"these {len(expected)} variable(s) takes at most {room}")


#: A checkpoint whose zip directory is larger than the expected variables' can be (a
#: larger model's) is still read this far, at least, to name the variables that differ:
#: its directory and its manifest up to ``max(SCAN_BYTES, 8 x`` what the expected
#: variables need``)`` bytes each.
SCAN_BYTES = 64 * 1024
_NUMBERED = re.compile(r"arr_[0-9]+\.npy")


def _directory_entries(data, ends):
    """Yield ``(name, method, crc32, compressed size, local header offset)`` of each
    complete central directory entry at the start of ``data`` (bytes read from the
    directory); ``ends[0]`` is then the offset after the last one."""
    pos = ends[0] = 0
    while pos + 46 <= len(data) and data[pos:pos + 4] == b"PK\x01\x02":
        (flags, method, crc, csize, usize, n, e, c) = struct.unpack_from(
            "<HH4xIIIHHH", data, pos + 8)
        offset = struct.unpack_from("<I", data, pos + 42)[0]
        end = pos + 46 + n + e + c
        if end > len(data):
            return
        raw = data[pos + 46:pos + 46 + n]
        name = raw.decode("utf-8" if flags & 0x800 else "cp437", "replace")
        extra, k = data[pos + 46 + n:pos + 46 + n + e], 0
        while k + 4 <= len(extra):  # zip64: the 32-bit fields that overflowed, in order
            tag, size = struct.unpack_from("<HH", extra, k)
            if tag == 1:
                vals = list(struct.unpack_from(f"<{min(size, 24) // 8}Q", extra, k + 4))
                if usize == 0xFFFFFFFF and vals:
                    vals.pop(0)
                if csize == 0xFFFFFFFF and vals:
                    csize = vals.pop(0)
                if offset == 0xFFFFFFFF and vals:
                    offset = vals.pop(0)
            k += 4 + size
        yield name, method, crc, csize, offset
        pos = ends[0] = end


def _larger_archive(f, expected, declared, start, room):
    """The message for a checkpoint with a larger zip directory than ``expected`` can
    have: the variables missing, unexpected and of another shape or dtype, from its
    manifest (or its member names, without one) read within bounds; ``None`` if they
    cannot be told within them. (Its memory is bounded too: the entries are looked at
    one by one, keeping a few names.)"""
    budget = min(declared, max(SCAN_BYTES, 8 * room))
    f.seek(start)
    data = f.read(budget)
    manifest, found, unexpected, count, plain, numbered = None, set(), [], 0, True, 0
    ends = [0]
    for entry in _directory_entries(data, ends):
        name = entry[0]
        count += 1
        if name == MANIFEST:
            manifest = entry
        elif not name.endswith(".npy"):
            plain = False
        elif name[:-4] in expected:
            found.add(name[:-4])
        elif _NUMBERED.fullmatch(name):  # a member of a checkpoint with a manifest
            numbered += 1
        elif len(unexpected) < 10:
            unexpected.append(name[:-4])
    whole = ends[0] == len(data) == declared
    n_unexpected = count - len(found) - (manifest is not None)
    if manifest is not None:
        return _larger_manifest(f, expected, manifest,
                                max(SCAN_BYTES, 8 * _manifest_limit(expected)))
    if not count or not plain:
        return None
    if numbered == count and not whole:  # its manifest lies beyond what was read
        return (f"holds more arrays than these {len(expected)} variable(s): at least "
                f"{count} (a checkpoint of another model? its zip directory has "
                f"{declared} bytes, its manifest was not read)")
    more = f" and {n_unexpected - len(unexpected)} more" \
        if n_unexpected > len(unexpected) else ""
    if whole:
        missing = [n for n in expected if n not in found]
        return (f"does not match the variables: missing {_some(sorted(missing))}, "
                f"unexpected {unexpected!r}{more}")
    return (f"does not match the variables: it holds more arrays than these "
            f"{len(expected)} variable(s), among them unexpected {unexpected!r}{more} "
            f"(in its first {count} members; its zip directory has {declared} bytes)")


def _larger_manifest(f, expected, entry, budget):
    """:func:`_larger_archive`'s message from the manifest ``entry`` of the directory,
    read (and inflated) to at most ``budget`` bytes; ``None`` if it cannot be."""
    _, method, crc, csize, offset = entry
    f.seek(offset)
    head = f.read(30)
    if len(head) != 30 or head[:4] != b"PK\x03\x04" or method not in (0, 8):
        return None
    n, e = struct.unpack_from("<HH", head, 26)
    f.seek(offset + 30 + n + e)
    data = f.read(min(csize, budget + 1))
    text = zlib.decompressobj(-15).decompress(data, budget + 1) if method == 8 else data
    if len(text) > budget or zlib.crc32(text) != crc:
        return None
    doc = json.loads(text)
    entries = doc.get("variables") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not all(
            isinstance(v, dict) and isinstance(v.get("name"), str) for v in entries):
        return None
    known = {manifest_form(n): n for n in expected}  # (see manifest_form)
    return _differences({known.get(v["name"], v["name"]): (v.get("dtype"), v.get("shape"))
                         for v in entries}, expected)


def _differences(held, expected):
    """The message saying how the variables a manifest lists (``{name: (dtype,
    shape)}``, as written) differ from ``expected``: missing, unexpected, and of another
    shape or dtype (``does not fit: ...`` when only that); ``None`` if they match."""
    missing = sorted(n for n in expected if n not in held)
    unexpected = sorted(n for n in held if n not in expected)
    other = []
    for name, (shape, dtype) in expected.items():
        if name not in held:
            continue
        got_dtype, got_shape = held[name]
        try:
            same = np.dtype(got_dtype) == dtype and tuple(got_shape) == shape
        except (TypeError, ValueError, OverflowError):
            same = False
        if not same:
            if not isinstance(got_shape, list):
                got_shape = [got_shape]
            other.append(_mismatch(name, got_dtype, got_shape, shape, dtype))
    if not missing and not unexpected:
        return other[0] if other else None
    more = f" and {len(other) - 10} more" if len(other) > 10 else ""
    shapes = "; ".join(o[len("does not fit: "):] for o in other[:10]) + more
    return (f"does not match the variables: missing {_some(missing)}, unexpected "
            f"{_some(unexpected)}" + (f"; of another shape or dtype: {shapes}"
                                      if other else ""))


def _manifest_limit(expected):
    """The most bytes a manifest of the ``expected`` variables can take."""
    return 1024 + sum(288 + 12 * len(n) + 24 * len(shape)
                      for n, (shape, _) in expected.items())


def _read_manifest(z, expected):
    """``{name: member}`` from the manifest, checked against the expected variables."""
    limit = _manifest_limit(expected)
    with z.open(MANIFEST) as m:
        text = m.read(limit + 1)
    if len(text) > limit:
        raise _Invalid(f"has a manifest larger than any manifest of these variables "
                       f"(at most {limit} bytes)")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise _Invalid(f"has a manifest that is not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise _Invalid(f"has a {MANIFEST} that is not a geon checkpoint manifest")
    if doc.get("version") != VERSION:
        raise _Invalid(f"is in checkpoint format version {doc.get('version')!r}; this "
                       f"geon reads version {VERSION}")
    entries = doc.get("variables")
    keys = {"name", "member", "dtype", "shape", "crc32"}
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and set(e) == keys and isinstance(e["name"], str)
            and isinstance(e["member"], str) and e["member"].endswith(".npy")
            and isinstance(e["dtype"], str) and isinstance(e["shape"], list)
            and all(type(d) is int and d >= 0 for d in e["shape"])
            and type(e["crc32"]) is int for e in entries):
        raise _Invalid("has a malformed manifest: 'variables' must list objects with a "
                       "name, a .npy member, a dtype, a shape and a crc32")
    known = {manifest_form(n): n for n in expected}  # (see manifest_form)
    for e in entries:
        e["name"] = known.get(e["name"], e["name"])
    members = {}
    for e in entries:
        if e["name"] in members:
            raise _Invalid(f"lists variable {e['name']!r} twice")
        members[e["name"]] = e["member"]
    if len(set(members.values())) != len(members) or MANIFEST in members.values():
        raise _Invalid("has a manifest that lists one member for two variables")
    missing = [m for m in members.values() if m not in z.NameToInfo]
    if missing:
        raise _Invalid(f"lacks the member(s) {_some(missing)} its manifest lists")
    for e in entries:
        if z.getinfo(e["member"]).CRC != e["crc32"]:
            raise _Invalid(f"has a member {e['member']!r} that is not the one its "
                           f"manifest lists for {e['name']!r} (another CRC-32)")
    # Names and shapes in one message: a checkpoint of another model differs in both.
    told = _differences({e["name"]: (e["dtype"], e["shape"]) for e in entries}, expected)
    if told:
        raise _Invalid(told)
    return members


def _check_names(members, expected):
    missing = [n for n in expected if n not in members]
    extra = [n for n in members if n not in expected]
    if missing or extra:
        raise _Invalid(f"does not match the variables: missing {_some(sorted(missing))}, "
                       f"unexpected {_some(sorted(extra))}")


def _some(items, k=10):
    """``items`` as a list for a message, at most ``k`` of them."""
    items = list(items)
    return repr(items) if len(items) <= k else f"{items[:k]!r} and {len(items) - k} more"


def _mismatch(name, dtype, shape, want_shape, want_dtype):
    try:
        shown = np.dtype(dtype).name
    except (TypeError, ValueError, OverflowError):
        shown = repr(dtype)
    return (f"does not fit: {name} is {shown}{list(shape)}, variable needs "
            f"{want_dtype.name}{list(want_shape)}")


def _read_exact(m, n, member, what):
    data = m.read(n)
    if len(data) != n:
        raise _Invalid(f"is truncated: member {member!r} ends inside its {what}")
    return data


def _check_header(m, name, member, want):
    """Read the ``.npy`` header of member ``m`` (bounded) and check that it declares
    the expected shape and dtype; returns whether the data is in Fortran order."""
    magic = _read_exact(m, 8, member, ".npy header")
    if magic[:6] != b"\x93NUMPY":
        raise _Invalid(f"member {member!r} is not a .npy array")
    version = (magic[6], magic[7])
    if version not in ((1, 0), (2, 0)):
        raise _Invalid(f"member {member!r} is in .npy format {version[0]}.{version[1]}; "
                       f"checkpoint arrays use 1.0 or 2.0")
    length = _read_exact(m, 2 if version == (1, 0) else 4, member, ".npy header")
    n = int.from_bytes(length, "little")
    if n > MAX_NPY_HEADER:
        raise _Invalid(f"member {member!r} has a .npy header of {n} bytes (at most "
                       f"{MAX_NPY_HEADER})")
    header = io.BytesIO(length + _read_exact(m, n, member, ".npy header"))
    reader = (np.lib.format.read_array_header_1_0 if version == (1, 0)
              else np.lib.format.read_array_header_2_0)
    try:
        shape, fortran, dtype = reader(header, max_header_size=MAX_NPY_HEADER)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as e:
        raise _Invalid(f"member {member!r} has a malformed .npy header: {e}") from None
    want_shape, want_dtype = want
    if dtype != want_dtype or tuple(shape) != want_shape:
        raise _Invalid(_mismatch(name, dtype, shape, want_shape, want_dtype))
    return fortran


def _read_array(m, member, shape, dtype, fortran):
    """The array after the header, read into a new buffer of the expected size; the
    member must end right after it (its CRC is then checked)."""
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n, np.uint8)
    view, pos = memoryview(raw), 0
    while pos < n:
        chunk = m.read(min(_CHUNK, n - pos))
        if not chunk:
            raise _Invalid(f"is truncated: member {member!r} ends inside its array")
        view[pos:pos + len(chunk)] = chunk
        pos += len(chunk)
    if m.read(1):
        raise _Invalid(f"member {member!r} has data after its array")
    a = raw.view(dtype)
    return a.reshape(shape[::-1]).T.copy() if fortran else a.reshape(shape)
