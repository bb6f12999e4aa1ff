"""A pods file watched for changes: add, remove and relabel pods by editing it, without a restart.

Polled, not inotify: a `stat` every `interval_s` costs nothing, works on every filesystem (NFS, a
ConfigMap volume whose symlink is swapped), and sees editors that write a new file and rename it.
When the file's (inode, size, mtime) changed, it is read and parsed with the launcher's own rules
(`load_pods_file`); the same text as last time is no news. A file that can not be read or parsed,
or that names a pod twice, keeps the last good pod set: the error is logged at ERROR once per
distinct error and shown in `status()` (the admin route, `epp pods list`, `epp up`'s console)
until a good version is saved. An empty list is a valid file: every pod of it drains.

The file is read by the datastore's process: on a multi-node cluster it must be readable on the
datastore's node (the launcher places the datastore on its own node when a file is watched)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any

from actors.options import PodSpec
from actors.pod_source import PodSource, Publish
from actors.pods_file import PodsFileError, load_pods_file

log = logging.getLogger("ray_epp.actors.datastore")


class WatchedPodsFile(PodSource):
    managed = True

    def __init__(self, path: str | Path, interval_s: float = 1.0) -> None:
        self.path = Path(path).resolve()
        super().__init__(f"file:{self.path}")
        self.interval_s = interval_s
        self.first_attempt = asyncio.Event()  # set after the first load, good or bad
        self._stamp: tuple[int, int, int] | None = None
        self._digest: str | None = None
        self._pods = 0
        self._loaded_at: float | None = None
        self._reloads = 0
        self._errors = 0
        self._error: str | None = None
        self._error_since: float | None = None

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def load(self) -> list[PodSpec] | None:
        """The file's pods when it changed and is valid; None when unchanged or invalid (then
        `status()` says why)."""
        stamp = self._stat()
        if stamp is not None and stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            text = self.path.read_bytes()
        except OSError as err:
            self._fail(f"can not read pods file {str(self.path)!r}: {err.strerror}")
            return None
        digest = hashlib.sha256(text).hexdigest()
        if digest == self._digest:
            return None
        try:
            specs = load_pods_file(self.path)
        except (ValueError, RecursionError) as err:  # PodsFileError; also a non-UTF-8 or too deep file
            self._fail(str(err) if isinstance(err, PodsFileError) else f"pods file {str(self.path)!r}: {err!r}")
            return None
        self._digest = digest
        return specs

    def _fail(self, error: str) -> None:
        self._errors += 1
        if error != self._error:
            log.error("pods file source %s: %s; keeping the last good pod set (%d pods)", self.id, error, self._pods)
            self._error_since = time.time()
        self._error = error

    async def run(self, publish: Publish) -> None:
        while True:
            try:
                specs = await asyncio.to_thread(self.load)
                if specs is not None:
                    await publish(specs)
                    if self._error is not None:
                        log.warning("pods file source %s: valid again (%d pods)", self.id, len(specs))
                    self._pods, self._loaded_at, self._error, self._error_since = len(specs), time.time(), None, None
                    self._reloads += 1
            except asyncio.CancelledError:
                raise
            except Exception as err:  # e.g. a pod name another source owns: keep watching
                self._stamp = self._digest = None  # try this content again next time
                self._fail(f"{type(err).__name__}: {err}")
            finally:
                self.first_attempt.set()
            await asyncio.sleep(self.interval_s)

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": "file",
            "path": str(self.path),
            "watch": True,
            "interval_s": self.interval_s,
            "ok": self._error is None and self._loaded_at is not None,
            "pods": self._pods,
            "loaded_at": self._loaded_at,
            "reloads": self._reloads,
            "errors": self._errors,
            "last_error": self._error,
            "error_since": self._error_since,
        }
