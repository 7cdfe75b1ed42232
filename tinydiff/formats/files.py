"""What the file formats share: text from a file made fit for a one-line message, the ModelError
that names the file, a write that never leaves a half-written file, and the table of tensors every
checkpoint reader answers names from."""
import mmap
import os
import tempfile

from ..errors import ModelError


def show(text):
    """Text from a file, made fit for a one-line message: it may hold newlines or be megabytes long."""
    text = str(text)
    if not text.isprintable():
        text = repr(text)
    return text if len(text) <= 200 else text[:200] + "..."


def fail(path, what):
    raise ModelError(f"{show(os.fspath(path))}: {what}")


def check_file(path):
    if not os.path.exists(path):
        fail(path, "file not found")
    if not os.path.isfile(path):
        fail(path, "not a regular file")


def map_file(path, min_size, what):
    """The file mapped read-only, after checking it exists and holds at least min_size bytes
    (`what`: the header that needs them). If another process truncates the file while it is
    mapped, touching the lost pages raises SIGBUS; nothing a reader can do about that. Our own
    writers replace files by rename instead."""
    check_file(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < min_size:
                fail(path, f"file is {size} bytes, too short for {what}")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        fail(path, f"cannot read: {e.strerror}")


def write_atomically(path, chunks):
    """Writes the byte chunks under a temporary name in path's folder, then renames it into place."""
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())  # the data must be on disk before the rename makes it visible
        os.chmod(tmp, 0o644)      # mkstemp makes it private; a checkpoint is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class TensorTable:
    """The names a checkpoint reader holds, in file order, and what it knows of each (`table`:
    name -> entry); a missing name is one ModelError line naming the file."""

    def __init__(self, path, table):
        self.path = path
        self._table = table

    @property
    def names(self):
        return list(self._table)

    def __contains__(self, name):
        return name in self._table

    def entry(self, name):
        if name not in self._table:
            fail(self.path, f"tensor {show(name)} missing")
        return self._table[name]
