"""`ExitWatch`: hears at once that a process of this host exited, any process (not only a
child), through a pidfd (Linux 5.3 and later): ResilientExecutor's process_control sees a
killed worker or manager within milliseconds instead of at its next look (every 0.25 s).

    watch = ExitWatch(lambda pid: print(pid, "exited"))
    watch.watch(worker_pid)      # True: watched; False: no pidfd here, or no such process
    ...
    watch.close()

One thread polls the pidfds. on_exit(pid) is called on that thread, once a watched process
has exited (it may still be a zombie its parent has not reaped); the pid is then forgotten
(watch it again if it comes back under a new process). Where pidfds are missing (another
OS, an older kernel, a seccomp filter) watch() returns False and the caller keeps its own
polling: ExitWatch only makes a watcher earlier, never the only one.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from typing import Callable

log = logging.getLogger("diaspora.exits")


class ExitWatch:
    """Calls on_exit(pid) on its own thread soon after a watched process exits.

    watch() and close() may be called from any thread. on_exit must not block for long (the
    next exit waits for it) and must not call close(). Errors: none raised from watch() (it
    returns False); an exception from on_exit is logged and the watch goes on."""

    def __init__(self, on_exit: Callable[[int], None], name: str = "diaspora-exits"):
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._pids: dict[int, int] = {}  # pid → its pidfd (guarded by _lock)
        self._new: list[tuple[int, int]] = []  # (pidfd, pid) opened, not yet polled (guarded by _lock)
        self._closed = False
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1
        self._name = name

    @staticmethod
    def supported() -> bool:
        """Whether this Python and kernel give pidfds (os.pidfd_open works on this process)."""
        if not hasattr(os, "pidfd_open"):
            return False
        try:
            os.close(os.pidfd_open(os.getpid()))
            return True
        except OSError:
            return False

    def watch(self, pid: int) -> bool:
        """Watches process `pid` of this host (already watched: nothing new). False when it
        cannot be watched: no pidfds here, no such process (it exited already: the caller's
        own look finds it gone), or the watch is closed."""
        if pid <= 0 or not hasattr(os, "pidfd_open"):
            return False
        with self._lock:
            if self._closed:
                return False
            if pid in self._pids:
                return True
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                return False
            self._pids[pid] = fd
            self._new.append((fd, pid))
            if self._thread is None:  # started with the first process watched
                self._wake_r, self._wake_w = os.pipe()
                os.set_blocking(self._wake_w, False)
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            else:
                self._wake()
        return True

    def watched(self) -> set[int]:
        """The pids watched now (for tests and operators)."""
        with self._lock:
            return set(self._pids)

    def close(self) -> None:
        """Stops the thread and closes every pidfd; watch() returns False from now on. Not
        from on_exit."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._wake()
        if thread is not None:
            thread.join(timeout=10)
        with self._lock:
            for fd in self._pids.values():
                os.close(fd)
            self._pids.clear()
            self._new.clear()
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:  # the pipe is full: the thread wakes anyway
            pass

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        polled: dict[int, int] = {}  # pidfd → pid, registered with poller
        while True:
            with self._lock:
                if self._closed:
                    return
                for fd, pid in self._new:
                    poller.register(fd, select.POLLIN)
                    polled[fd] = pid
                self._new.clear()
            for fd, _ in poller.poll():
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                pid = polled.pop(fd)
                poller.unregister(fd)
                with self._lock:
                    if self._closed:
                        return
                    del self._pids[pid]
                    os.close(fd)
                try:
                    self._on_exit(pid)
                except Exception:
                    log.exception("ExitWatch: on_exit(%d) failed", pid)
