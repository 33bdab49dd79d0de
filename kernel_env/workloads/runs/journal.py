"""A resumable run's journal: an append-only JSONL file, one record per line, each on disk before
``append`` returns.

Every long run that a rerun resumes keeps what it finished in one: `kernel-env eval`'s run file,
`kernel-env generate`'s ``<output>.journal.jsonl``, `kernel-env synth`'s ``candidates.jsonl``
and ``verdicts.jsonl``.

- ``Journal``: ``append`` (durable), ``read`` (changes nothing), ``create`` and ``repair`` (cut
  a torn last line).
- ``Entry``: a record and its line; ``JournalError``: a file that is not a journal.

Before touching it: a record whose ``append`` returned survives the process being killed; only
the one being written then can be lost, as a torn last line, which nobody was promised. A file
that is not a journal raises JournalError and is left as it is, so pointing a run at the wrong
file never cuts it. A journal has one writer at a time, and this module never removes a whole
record. Which key says a sample is done, which records a rerun retries, and whether a torn
record inside the file is refused (eval's run file and ``kernel-env report``) or skipped
(synth's journals) is each run's business.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: How much of a file's end is read at a time when looking for its last line.
_CHUNK = 1 << 16
_JSON_NAMES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}


class JournalError(ValueError):
    """A file that is not a journal: ``line`` (1-based) is not a JSON object, ``why`` says what it is."""

    def __init__(self, path: Path, line: int, why: str):
        super().__init__(f"{path}, line {line}: not a journal record ({why}); the file is left as it is")
        self.path, self.line, self.why = path, line, why


@dataclass(frozen=True)
class Entry:
    """One record of a journal and the line it is on (1-based, for messages)."""

    line: int
    record: dict[str, Any]


class Journal:
    """The journal at ``path`` (the file need not exist yet). Not thread-safe: one writer.

    A torn last line is what a write cut short leaves: bytes after the last newline that are not a
    JSON object (a prefix of one, or the zeros a power loss can leave). Once repaired, every line
    of a journal is a whole record, and a rerun's records start on a line of their own."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        #: Set by ``read``: the file ended in a torn line (``repair`` cuts it).
        self.torn = False
        #: Set by ``read``: the lines of record fragments inside the file, skipped.
        self.skipped: list[int] = []
        self._repaired = False

    def read(self) -> list[Entry]:
        """Every record on file, in order, with its line number ([] when there is no file); changes
        nothing. Blank lines are skipped; a torn last line is left out (``torn`` says it was there);
        a record fragment inside the file (a line that starts like a record and is not JSON: what
        `kernel-env synth` left before this module, when it kept a torn line and started a new one)
        is skipped with a warning (``skipped`` lists them). Raises JournalError for any other line
        that is not a JSON object, and OSError when the file cannot be read."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        entries: list[Entry] = []
        self.torn, self.skipped = False, []
        lines = data.split(b"\n")  # the last item is what follows the last newline (b"" normally)
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            record = _parse(self.path, number, line)
            if record is not None:
                entries.append(Entry(number, record))
            elif number == len(lines):
                self.torn = True
            else:
                self.skipped.append(number)
                log.warning("journal %s, line %d: skipped a torn record that an earlier run left inside the file",
                            self.path, number)
        return entries

    def create(self) -> None:
        """Make the file (empty) and its folder if they are not there, and ``repair`` it: a run that
        starts writing calls this, so that a run that never started leaves nothing."""
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o666))  # the umask's mode, as open() gives
            _sync_folder(self.path.parent)
        self.repair()

    def repair(self) -> None:
        """End the file on a whole line: cut a torn last line (logged), end the line of a whole last
        record that lost its newline. Nothing to do for a missing, empty or whole file; only the
        file's last line is read. Raises JournalError, changing nothing, for a last line that is
        neither a record nor a fragment of one."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size:
            with self.path.open("rb") as handle:
                start, tail = _last_line(handle, size)
                try:
                    torn = bool(tail.strip()) and _parse(self.path, 0, tail) is None
                except JournalError as exc:  # give its line's number
                    handle.seek(0)
                    raise JournalError(self.path, handle.read(start).count(b"\n") + 1, exc.why) from None
            if torn:
                with self.path.open("r+b") as handle:
                    handle.truncate(start)
                    os.fsync(handle.fileno())
                log.warning("journal %s: cut a torn last line (%d bytes of a record that was being written when a "
                            "run stopped)", self.path, len(tail))
            elif tail:  # a whole record (or blanks) without its newline: keep it, end its line
                with self.path.open("ab") as handle:
                    handle.write(b"\n")
                    handle.flush()
                    os.fsync(handle.fileno())
        self.torn = False
        self._repaired = True

    def append(self, record: Mapping[str, Any] | str) -> None:
        """Write one record as a line (a JSON object, then ``\\n``); on disk when this returns:
        written, fsynced, and the folder fsynced when this append made the file. ``record`` is a
        mapping (written as ``json.dumps(record)``: TypeError for a value JSON cannot hold) or a JSON
        object its caller serialised on one line (a pydantic model's ``model_dump_json()``). The
        file and its folder are made if they are not there. The first append of this Journal
        repairs the file first (``repair``)."""
        line = record if isinstance(record, str) else json.dumps(record)
        if not line.startswith("{") or "\n" in line:
            raise ValueError(f"journal {self.path}: a record is one JSON object on one line, got {line[:60]!r}")
        if not self._repaired:
            self.repair()
        data, created = memoryview((line + "\n").encode()), False
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, created = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666), True
        try:
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            _sync_folder(self.path.parent)


def _parse(path: Path, number: int, line: bytes) -> dict[str, Any] | None:
    """The record on a (non-blank) line, or None for a fragment of one: a line that starts like a
    record but is not JSON, or only zero bytes. Raises JournalError for anything else."""
    try:
        value = json.loads(line)
    except ValueError:  # UnicodeDecodeError too: a write torn inside a character
        if line.lstrip().startswith(b"{") or not line.strip(b"\0"):
            return None
        raise JournalError(path, number, "not JSON") from None
    if not isinstance(value, dict):
        raise JournalError(path, number, f"{_JSON_NAMES.get(type(value), 'a JSON value')}, not a JSON object")
    return value


def _last_line(handle: Any, size: int) -> tuple[int, bytes]:
    """(where the file's last line starts, its bytes after the last newline): b"" for a file that
    is empty or ends with a newline. Reads back from the end only as far as that newline."""
    end = size
    tail = b""
    while end > 0:
        begin = max(0, end - _CHUNK)
        handle.seek(begin)
        chunk = handle.read(end - begin)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            return begin + cut + 1, chunk[cut + 1:] + tail
        tail, end = chunk + tail, begin
    return 0, tail


def _sync_folder(folder: Path) -> None:
    """fsync a folder, so that a file just made in it is there after a crash."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # EINVAL: a file system that cannot sync folders; the file's fsync stands
            raise
    finally:
        os.close(fd)
