"""A small durable key-value store: the kind of storage code a project writes itself.

It knows nothing of faultfs. State is a snapshot file plus an append-only log
of checksummed records:

* ``put`` and ``delete`` append one record and fsync the log before returning
  (returning is the acknowledgement);
* opening the store loads the snapshot, replays the log, and cuts a torn or
  corrupt tail (a record whose checksum does not match ends the log);
* ``compact`` writes the whole state to a temporary file, fsyncs it, renames it
  over the snapshot, fsyncs the directory, then empties the log.

``BuggyKVStore`` is the same store with one line missing: its ``compact``
does not fsync the directory after the rename, so a power cut after the log
was emptied can lose everything the snapshot was meant to hold.
"""

from __future__ import annotations

import json
import os
import zlib

LOG = "kv.log"
SNAPSHOT = "kv.snapshot"


def _encode(record: dict[str, str]) -> bytes:
    body = json.dumps(record, sort_keys=True).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _decode(line: bytes) -> dict[str, str] | None:
    """The record on ``line``, or None if the line is torn or corrupt."""
    checksum, _, body = line.partition(b" ")
    try:
        if int(checksum, 16) != zlib.crc32(body):
            return None
        record: dict[str, str] = json.loads(body)
    except ValueError:
        return None
    return record


class KVStore:
    """Open (and recover) the store kept in ``directory``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.log_path = os.path.join(directory, LOG)
        self.snapshot_path = os.path.join(directory, SNAPSHOT)
        self.data = self._load_snapshot()
        self._replay_log()
        self._log = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._sync_directory()  # the log's directory entry must be durable too

    # -------------------------------------------------------------- reading

    def get(self, key: str) -> str | None:
        return self.data.get(key)

    def items(self) -> dict[str, str]:
        return dict(self.data)

    # -------------------------------------------------------------- writing

    def put(self, key: str, value: str) -> None:
        self._append({"op": "put", "key": key, "value": value})
        self.data[key] = value

    def delete(self, key: str) -> None:
        self._append({"op": "delete", "key": key})
        self.data.pop(key, None)

    def compact(self) -> None:
        """Fold the log into the snapshot and empty the log."""
        tmp = self.snapshot_path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, json.dumps(self.data, sort_keys=True).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self._publish(tmp)
        os.ftruncate(self._log, 0)
        os.fsync(self._log)

    def close(self) -> None:
        os.close(self._log)

    # ------------------------------------------------------------- internals

    def _publish(self, tmp: str) -> None:
        os.replace(tmp, self.snapshot_path)
        self._sync_directory()

    def _append(self, record: dict[str, str]) -> None:
        _write_all(self._log, _encode(record))
        os.fsync(self._log)

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _load_snapshot(self) -> dict[str, str]:
        try:
            with open(self.snapshot_path, "rb") as handle:
                data: dict[str, str] = json.loads(handle.read())
                return data
        except FileNotFoundError:
            return {}

    def _replay_log(self) -> None:
        try:
            with open(self.log_path, "rb") as handle:
                content = handle.read()
        except FileNotFoundError:
            return
        good = 0
        while (end := content.find(b"\n", good)) >= 0:
            record = _decode(content[good:end])
            if record is None:
                break
            if record["op"] == "put":
                self.data[record["key"]] = record["value"]
            else:
                self.data.pop(record["key"], None)
            good = end + 1
        if good < len(content):  # a torn or corrupt tail: cut it before appending
            fd = os.open(self.log_path, os.O_WRONLY)
            try:
                os.ftruncate(fd, good)
                os.fsync(fd)
            finally:
                os.close(fd)


class BuggyKVStore(KVStore):
    """KVStore with a planted bug: compact() renames without fsyncing the directory."""

    def _publish(self, tmp: str) -> None:
        os.replace(tmp, self.snapshot_path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
