"""What the file formats share: text from a file made fit for a one-line message, the ModelError
that names the file, a write that never leaves a half-written file (nor, for long, its temporary),
and the table of tensors every checkpoint reader answers names from."""
import mmap
import os
import re
import signal
import tempfile
import threading

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
    """Writes the byte chunks under a temporary name in path's folder, then renames it into place.

    The temporary, .NAME.PID.XXXXXXXX.tmp, goes away however the write ends: on an exception
    (Ctrl-C too), on SIGTERM (turned into an exception for the write's duration, in the main
    thread; the signal is delivered again once the temporary is gone, so the process still ends as
    SIGTERM ends it), and after SIGKILL, which nothing can catch, at the next write to the same
    path: temporaries of it whose writer process is gone are removed first."""
    path = os.fspath(path)
    folder, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    _remove_stale_temporaries(folder, name)
    with _sigterm_as_exception():
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.{os.getpid()}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())  # the data must be on disk before the rename makes it visible
            os.chmod(tmp, 0o644)      # mkstemp makes it private; a checkpoint is an ordinary file
            os.replace(tmp, path)
        except BaseException:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            raise


class _Terminated(BaseException):
    """SIGTERM arrived during a write (BaseException: no `except Exception` may swallow it)."""


class _sigterm_as_exception:
    """For its duration, in the main thread, SIGTERM raises _Terminated instead of ending the
    process at once. On exit the old handler is back, and a SIGTERM received is sent again: the
    default action ends the process there; a handler of the program's own runs, and if it returns,
    _Terminated goes on up (the write did not happen). Elsewhere (another thread, SIGTERM
    ignored) it changes nothing."""

    def __enter__(self):
        self.received, self.old = False, None
        if threading.current_thread() is threading.main_thread():
            old = signal.getsignal(signal.SIGTERM)
            if old is not signal.SIG_IGN:
                self.old = signal.SIG_DFL if old is None else old   # None: set outside Python
                signal.signal(signal.SIGTERM, self._raise)
        return self

    def _raise(self, signum, frame):
        self.received = True
        raise _Terminated("SIGTERM during a write")

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)
            if self.received:
                os.kill(os.getpid(), signal.SIGTERM)
        return False


def _remove_stale_temporaries(folder, name):
    """Removes write_atomically's temporaries of `name` whose writer process no longer exists."""
    pattern = re.compile(rf"\.{re.escape(name)}\.(\d+)\.[^.]+\.tmp")
    try:
        entries = os.listdir(folder)
    except OSError:
        return                     # the write itself will report the folder
    for entry in entries:
        m = pattern.fullmatch(entry)
        if m and not _process_exists(int(m.group(1))):
            try:
                os.unlink(os.path.join(folder, entry))
            except OSError:
                pass               # another writer removed it first


def _process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True                # another user's process (or a pid we cannot ask about): leave it
    return True


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
