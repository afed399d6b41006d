"""Run `python -m sglang.launch_server` as a supervised child process.

The child gets its own session, hence its own process group: SGLang's tensor-parallel workers
join that group, a Ctrl+C in the daemon's terminal does not reach them, and stopping means
signalling the whole group (SIGTERM, then SIGKILL after a grace period) until no member is
left, so no orphan keeps GPU memory. Its output goes, line by line, to the daemon's log and to
`sglang.log` in the state dir. `start()` waits until `/health_generate` answers (a 124B model takes
minutes to load) and shows progress meanwhile. If the server dies later it is restarted with
backoff; until it is back, `unavailable()` says why, and the adapter answers 503 with that.

A daemon that is killed (SIGKILL) cannot stop its child, so the group id is kept in
`sglang.pid`; the next start stops a group it finds still running from there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable

import httpx

from lingcode import paths
from lingcode.engine import EngineStartError

HEALTH_PATH = "/health_generate"  # runs a one-token generation: the model is really loaded
PROGRESS_EVERY_S = 15.0


class StartupFailed(EngineStartError):
    """SGLang exited, or never answered, before it was ready. The message is one line."""


def _stderr_line(line: str) -> None:
    print(f"sglang | {line}", file=sys.stderr, flush=True)


def _redact(command: list[str]) -> str:
    shown = list(command)
    for i, arg in enumerate(shown[:-1]):
        if arg == "--api-key":
            shown[i + 1] = "***"
    return " ".join(shown)


def _start_time(pid: int) -> str | None:
    """When a process started (clock ticks since boot, /proc/PID/stat field 22): tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[19]


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: signal 0 tells whether anything is left at all
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def stop_group(pgid: int, grace_s: float, leader: subprocess.Popen | None = None) -> None:
    """SIGTERM the group, wait up to grace_s for every member to exit, then SIGKILL what is left."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if leader is not None:
                leader.poll()  # reap it, or it stays a zombie member
            if not group_members(pgid):
                return
            time.sleep(0.05)


class Supervisor:
    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        *,
        url: str,
        log_file: Path,
        on_line: Callable[[str], None] = _stderr_line,
        ready_timeout_s: float = 3600.0,
        backoff_s: tuple[float, ...] = (2, 4, 8, 16, 32, 60),
        max_failures: int = 5,
        stable_after_s: float = 300.0,
        stop_grace_s: float = 30.0,
    ):
        self.command, self.env, self.url = command, env, url.rstrip("/")
        self.log_file = log_file
        self.pid_file = log_file.with_name("sglang.pid")
        self.on_line = on_line
        self.ready_timeout_s, self.backoff_s, self.max_failures = ready_timeout_s, backoff_s, max_failures
        self.stable_after_s, self.stop_grace_s = stable_after_s, stop_grace_s
        self.state, self.reason = "stopped", "SGLang is not started"
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._ready_since: float | None = None
        self._failures = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # no spawn can slip in after stop() decided to stop
        self._tail: deque[str] = deque(maxlen=20)
        self._watcher: threading.Thread | None = None

    # --- what the adapter and `stats` read --------------------------------------------------

    def unavailable(self) -> str | None:
        return None if self.state == "ready" else self.reason

    def status(self) -> dict:
        proc = self._proc
        return {
            "state": self.state,
            "reason": None if self.state == "ready" else self.reason,
            "pid": proc.pid if proc else None,
            "restarts": self.restarts,
            "log": str(self.log_file),
        }

    # --- life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Launch SGLang and block until it answers, or raise StartupFailed."""
        self._stop_stale()
        self._set("starting", "SGLang is loading the model")
        try:
            spawned = self._spawn()
        except OSError as exc:  # preflight checks the interpreter, but it can vanish in between
            self._set("failed", f"cannot run {self.command[0]}")
            raise StartupFailed(f"cannot run {self.command[0]}: {exc.strerror or exc}") from None
        if not spawned or not self._wait_ready():
            code = self._proc.poll() if self._proc else None
            self._stop_child()
            last = self._tail[-1] if self._tail else "no output"
            what = f"exited with code {code}" if code is not None else f"did not answer in {self.ready_timeout_s:.0f} s"
            self._set("failed", f"SGLang {what}")
            raise StartupFailed(
                f"SGLang {what} before it was ready; last line: {last.strip()[:300]} (log: {self.log_file})"
            )
        self._watcher = threading.Thread(target=self._watch, name="lingcode-sglang-watch", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        """Stop SGLang and every process of its group; idempotent."""
        with self._lock:
            self._stopping.set()
        self._stop_child()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=5)
        self._set("stopped", "SGLang is stopped")

    # --- internals -------------------------------------------------------------------------------

    def _set(self, state: str, reason: str) -> None:
        self.state, self.reason = state, reason

    def _spawn(self) -> bool:
        with self._lock:
            if self._stopping.is_set():
                return False
            self._spawn_locked()
            return True

    def _spawn_locked(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(paths.private_file(self.log_file), "a", encoding="utf-8") as log:
            log.write(f"\n=== lingcode {time.strftime('%Y-%m-%d %H:%M:%S')}: starting {_redact(self.command)}\n")
        self._proc = proc = subprocess.Popen(
            self.command,
            env={**os.environ, **self.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
        paths.private_file(self.pid_file).write_text(json.dumps({"pgid": proc.pid, "started": _start_time(proc.pid)}))
        threading.Thread(target=self._pump, args=(proc,), name="lingcode-sglang-log", daemon=True).start()

    def _pump(self, proc: subprocess.Popen) -> None:
        """Child output -> sglang.log and the daemon's log. Text mode turns tqdm's \\r into lines."""
        with open(self.log_file, "a", encoding="utf-8") as log:
            for line in proc.stdout:
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                self._tail.append(line)
                log.write(line + "\n")
                log.flush()
                self.on_line(line)

    def _wait_ready(self) -> bool:
        proc, started = self._proc, time.monotonic()
        next_note = started + PROGRESS_EVERY_S
        with httpx.Client(timeout=httpx.Timeout(30.0, connect=2.0)) as client:
            while not self._stopping.is_set():
                if proc.poll() is not None:
                    return False
                now = time.monotonic()
                if now - started > self.ready_timeout_s:
                    return False
                if now >= next_note:
                    self.on_line(f"[lingcode] waiting for SGLang to load the model ({now - started:.0f} s)")
                    next_note = now + PROGRESS_EVERY_S
                try:
                    if client.get(self.url + HEALTH_PATH).status_code == 200:
                        self._ready_since = time.monotonic()
                        self._set("ready", "")
                        self.on_line(f"[lingcode] SGLang is ready at {self.url} ({time.monotonic() - started:.0f} s)")
                        return True
                except httpx.HTTPError:
                    pass
                self._stopping.wait(0.5)
        return False

    def _watch(self) -> None:
        """Restart SGLang with backoff whenever it exits, until stop() or too many failures in a row."""
        while True:
            code = self._proc.wait()
            if self._stopping.is_set():
                return
            self._stop_child()  # the TP workers a dead server leaves behind hold GPU memory
            if self._ready_since is not None and time.monotonic() - self._ready_since >= self.stable_after_s:
                self._failures = 0
            self._ready_since = None
            self._failures += 1
            if self._failures > self.max_failures:
                self._set(
                    "failed",
                    f"SGLang exited {self.max_failures + 1} times in a row (last exit code {code}); "
                    f"see {self.log_file} and restart lingcode",
                )
                self.on_line(f"[lingcode] {self.reason}")
                return
            delay = self.backoff_s[min(self._failures, len(self.backoff_s)) - 1]
            self._set("restarting", f"SGLang exited with code {code} and is restarting (next try in {delay:g} s)")
            self.on_line(f"[lingcode] {self.reason}")
            if self._stopping.wait(delay):
                return
            self.restarts += 1
            self._set("restarting", f"SGLang exited with code {code} and is reloading the model")
            try:
                if not self._spawn():
                    return
            except OSError as exc:
                self._set("failed", f"cannot restart SGLang: {exc.strerror or exc}")
                self.on_line(f"[lingcode] {self.reason}")
                return
            if not self._wait_ready() and not self._stopping.is_set():
                self._stop_child()  # alive but never ready: count it as a failure (the loop sees it exit)

    def _stop_child(self) -> None:
        proc = self._proc
        if proc is None:
            return
        stop_group(proc.pid, self.stop_grace_s, leader=proc)
        proc.poll()
        self.pid_file.unlink(missing_ok=True)

    def _stop_stale(self) -> None:
        """Stop a group that a killed daemon left running (recorded in sglang.pid)."""
        try:
            record = json.loads(self.pid_file.read_text())
            pgid, started = int(record["pgid"]), record["started"]
        except (OSError, ValueError, KeyError, TypeError):
            return
        # A live leader must be the very process we started (pids get reused). With the leader gone,
        # the group id cannot have been reused while members remain: those are its orphans.
        leader_started = _start_time(pgid)
        if group_members(pgid) and leader_started in (None, started):
            self.on_line(f"[lingcode] stopping SGLang (process group {pgid}) left running by an earlier daemon")
            stop_group(pgid, self.stop_grace_s)
        self.pid_file.unlink(missing_ok=True)
