"""A judge kept between commands: `python -m htam_engine.evaluate.keeper CONDITIONS [IDLE_S]`.

A one-shot `htam eval` pays for three torch imports (the judge's and its two workers')
before anything of its own: 4-5 s on two cores, most of a one-shot. The keeper is a
small process without torch that keeps one judge started under the last command's
conditions (`jobspec.Conditions`), waiting for a task, and lends it to the next command
over a Unix socket in `HTAM_HOME/keeper/`: the judge's pipes, a pidfd and its folder's
lock pass as file descriptors (`SCM_RIGHTS`), and the command drives the judge as its
own (`borrow`). A judge is lent only to a command of the same conditions, interpreter,
HTAM code and judge environment (`context`). The judge stays the keeper's child: once
the command's connection closes (it finished, or died), the keeper kills what is left
of it, and it starts the next only when a command asks after its evaluation and no
judge is lent, so no start runs beside a timing. It exits after `IDLE_S` without a
command, and its spare with it.

The spare has seen no task and no candidate, and serves one job, as an in-process
spare (`standby`). The keeper runs only under bwrap: a candidate then cannot reach
`HTAM_HOME`, so it can neither borrow a judge nor plant a keeper of its own that lends
a judge it wrote. `HTAM_KEEPER=0` turns it off.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from htam_engine.evaluate.jobfolder import Started, judge_env, launch
from htam_engine.evaluate.jobspec import Conditions
from htam_engine.evaluate.process import Child
from htam_engine.evaluate.sandbox import sandbox_mode
from htam_engine.paths import held, subdir

IDLE_S = 600.0  # a spare judge and its workers hold ~0.5 GB: no longer than a pause
REPLY_S = 2.0  # a keeper that does not answer in this time is not waited for
SOCKET_NAME = "keeper.sock"
LOCK_NAME = "keeper.lock"
LOG_NAME = "keeper.log"
ENV_SWITCH = "HTAM_KEEPER"
MAX_REQUEST = 1 << 16
_FDS = 4  # the judge's stdin and stdout, its pidfd, its folder's lock


def enabled() -> bool:
    """Is a keeper allowed here: not turned off, and candidates run under bwrap."""
    return os.environ.get(ENV_SWITCH, "1") != "0" and sandbox_mode() == "bwrap"


def context(env: dict[str, str] | None = None) -> dict[str, str]:
    """What a judge depends on besides its conditions: the interpreter, HTAM's code as it
    is on disk now, and the judge's environment (`env`, default: this process's). A
    command after an upgrade, or in another environment, never borrows a judge started
    before it."""
    package = Path(__file__).resolve().parents[1]
    code = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        code.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    judged = json.dumps(judge_env() if env is None else env, sort_keys=True)
    return {
        "python": sys.executable,
        "code": code.hexdigest()[:16],
        "env": hashlib.sha256(judged.encode()).hexdigest()[:16],
    }


def _folder() -> Path:
    folder = subdir("keeper")
    folder.chmod(0o700)
    return folder


@contextlib.contextmanager
def _address() -> Iterator[str]:
    """The socket's path, through a descriptor of its folder: short, however long
    `HTAM_HOME` is (a Unix socket's path is capped at 107 bytes)."""
    descriptor = os.open(_folder(), os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{descriptor}/{SOCKET_NAME}"
    finally:
        os.close(descriptor)


# --- the command's side ---------------------------------------------------------------


class Lent:
    """The calls a command makes on its judge's process (`subprocess.Popen`'s), for a
    judge the keeper started: its exit is seen through a pidfd; its status is the
    keeper's to reap, and reads as `LENT_EXIT`."""

    LENT_EXIT = 1

    def __init__(self, pid: int, pidfd: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout

    def poll(self) -> int | None:
        return self.LENT_EXIT if select.select([self.pidfd], [], [], 0)[0] else None

    def wait(self, timeout: float | None = None) -> int:
        if not select.select([self.pidfd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired("judge", timeout or 0)
        return self.LENT_EXIT

    def close(self) -> None:
        for stream in (self.stdin, self.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        os.close(self.pidfd)


def borrow(conditions: Conditions) -> Started | None:
    """The keeper's spare judge for `conditions`, lent to this process until it is
    finished (or this process ends); None when no keeper has one."""
    if not enabled():
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fds: list[int] = []
    try:
        _send(connection, {"borrow": conditions.to_json(), "context": context()})
        message, fds, _flags, _sender = socket.recv_fds(connection, 4096, _FDS)
        reply = json.loads(message)
        if not isinstance(reply, dict) or "jobdir" not in reply or len(fds) != _FDS:
            raise ValueError("no judge lent")
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        connection.close()
        return None
    stdin, stdout, pidfd, owner = fds
    jobdir = Path(reply["jobdir"])
    process = Lent(int(reply["pid"]), pidfd, os.fdopen(stdin, "wb"), os.fdopen(stdout, "rb"))
    judge = Child.adopt("judge", process, jobdir / "judge.log", str(reply["token"]))

    def give_back() -> None:  # the keeper then kills what is left and reaps it
        process.close()
        connection.close()

    return Started(jobdir, judge, conditions, owner, give_back=give_back)


def ensure(conditions: Conditions) -> None:
    """After a command's evaluation: ask the keeper for a spare under `conditions`, or
    start a keeper in the background if none runs (and keepers are on here)."""
    if not enabled():
        return
    if _running():
        asked = {"want": conditions.to_json(), "env": judge_env(), "context": context()}
        if not _request(asked).get("retiring"):
            return
        deadline = time.monotonic() + REPLY_S  # it runs older code: a new keeper follows
        while _running() and time.monotonic() < deadline:
            time.sleep(0.05)
    folder = _folder()
    with (folder / LOG_NAME).open("ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", "htam_engine.evaluate.keeper", json.dumps(conditions.to_json())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd=folder,  # not the command's: that folder may go
            start_new_session=True,  # not the command's terminal's: Ctrl-C there is not for it
        )


def _request(message: dict[str, Any]) -> dict[str, Any]:
    """The keeper's reply to `message` ({} without one)."""
    with contextlib.suppress(OSError, ValueError), socket.socket(socket.AF_UNIX) as connection:
        _send(connection, message)
        reply = json.loads(connection.recv(4096))
        return reply if isinstance(reply, dict) else {}
    return {}


def _send(connection: socket.socket, message: dict[str, Any]) -> None:
    """Connect to the keeper and send it `message`, one line (OSError if none listens)."""
    connection.settimeout(REPLY_S)
    with _address() as address:
        connection.connect(address)
    connection.sendall(json.dumps(message).encode() + b"\n")


def stop(home: Path) -> None:
    """Stop the keeper of the HTAM home `home`, if one runs (its judge goes with it)."""
    if (pid := holder(home)) is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


def holder(home: Path) -> int | None:
    """The pid of the keeper holding `home`'s lock, or None. A keeper writes its pid just
    after it takes the lock: an empty lock is read again until then (up to REPLY_S)."""
    lock = home / "keeper" / LOCK_NAME
    deadline = time.monotonic() + REPLY_S
    while True:
        try:
            if not held(os.open(lock, os.O_RDONLY)):
                return None
            text = lock.read_text().strip()
        except OSError:
            return None
        if text.isdigit():
            return int(text)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)


def _running() -> bool:
    return held(os.open(_folder() / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600))


# --- the keeper's side ----------------------------------------------------------------


class Keeper:
    """One spare judge, lent to one command at a time; the next is started only when a
    command asks for it after its evaluation (`want`), as an in-process spare is. A
    command running other code than the keeper's (an upgrade, another interpreter) makes
    it retire: it leaves once nothing is lent, and that command starts a new one."""

    def __init__(self, conditions: Conditions, env: dict[str, str]) -> None:
        self.own = context(env)
        self.spare: Started | None = None
        self.spare_context: dict[str, str] = {}
        self.lent: dict[socket.socket, Started] = {}
        self.last_used = time.monotonic()
        self.wanted = (conditions, env)
        self.pending = True  # a spare is asked for and not yet started
        self.retiring = False

    def tend(self) -> None:
        """Start the spare asked for, once no judge is lent: none starts beside a
        timing (a command asks after its evaluation, perhaps before it gave back)."""
        if not self.pending or self.lent or self.retiring:
            return
        conditions, env = self.wanted
        wanted_context = context(env)
        spare = self.spare
        if spare is not None and (
            spare.conditions != conditions
            or self.spare_context != wanted_context
            or spare.judge.popen.poll() is not None
        ):
            spare.finish()
            self.spare = None
        if self.spare is None:
            self.spare_context = wanted_context
            self.spare = launch(conditions, listen=False, env=env)
        self.pending = False

    def answer(self, connection: socket.socket) -> bool:
        """Serve one request on `connection`; True if a judge was lent on it."""
        try:
            connection.settimeout(REPLY_S)
            if _peer_uid(connection) != os.getuid():
                return False
            request = json.loads(_line(connection))
            asked = request["context"]
            code = {key: asked[key] for key in ("python", "code")}
        except (OSError, ValueError, KeyError, TypeError):
            return False
        self.last_used = time.monotonic()
        if code != {key: self.own[key] for key in code}:
            self.retiring = True
            _log("retiring: a command runs other code than this keeper's")
            _say(connection, {"retiring": True})
            return False
        if (want := _conditions(request.get("want"))) and isinstance(request.get("env"), dict):
            self.wanted, self.pending = (want, request["env"]), True
            _say(connection, {"wanted": True})
            return False
        wanted = request.get("borrow")
        return isinstance(wanted, dict) and self.lend(connection, _conditions(wanted), asked)

    def lend(
        self, connection: socket.socket, conditions: Conditions | None, asked: dict[str, str]
    ) -> bool:
        spare = self.spare
        if (
            spare is None
            or conditions is None
            or spare.conditions != conditions
            or self.spare_context != asked
            or spare.judge.popen.poll() is not None
        ):
            _say(connection, {"none": "no spare judge for these conditions"})
            return False
        judge = spare.judge
        assert judge.popen.stdin is not None and judge.popen.stdout is not None
        pidfd = os.pidfd_open(judge.popen.pid)
        fds = [judge.popen.stdin.fileno(), judge.popen.stdout.fileno(), pidfd, spare.owner]
        reply = {"jobdir": str(spare.jobdir), "pid": judge.popen.pid, "token": judge.token}
        try:
            socket.send_fds(connection, [json.dumps(reply).encode()], fds)
        except OSError:
            return False
        finally:
            os.close(pidfd)
        self.lent[connection] = spare
        self.spare = None
        _log(f"lent the judge of {spare.jobdir.name} (pid {judge.popen.pid})")
        return True

    def give_back(self, connection: socket.socket) -> None:
        """The command is done with its judge (or gone): what is left of it goes."""
        self.lent.pop(connection).finish()
        connection.close()
        self.last_used = time.monotonic()

    def done(self, idle_s: float) -> bool:
        """Nothing lent, and retiring or idle for `idle_s`."""
        idle = time.monotonic() - self.last_used >= idle_s
        return not self.lent and (self.retiring or idle)

    def close(self) -> None:
        for connection in list(self.lent):
            self.give_back(connection)
        if self.spare is not None:
            self.spare.finish()


def _line(connection: socket.socket) -> bytes:
    """One request line (at most `MAX_REQUEST` bytes: an environment can be long)."""
    data = b""
    while not data.endswith(b"\n") and len(data) < MAX_REQUEST:
        chunk = connection.recv(MAX_REQUEST - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _peer_uid(connection: socket.socket) -> int:
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int(struct.unpack("3i", credentials)[1])


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} keeper: {message}", file=sys.stderr, flush=True)


def _say(connection: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        connection.sendall(json.dumps(message).encode())


def serve(conditions: Conditions, idle_s: float = IDLE_S) -> None:
    """Keep a judge for `conditions` until `idle_s` pass without a command; return at
    once if another keeper holds the lock."""
    folder = _folder()
    lock = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return
    os.ftruncate(lock, 0)
    os.write(lock, f"{os.getpid()}\n".encode())  # who keeps judges here: for people
    path = folder / SOCKET_NAME
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with _address() as address:
        listener.bind(address)
    path.chmod(0o600)
    listener.listen()
    keeper = Keeper(conditions, judge_env())
    stopping = threading.Event()  # set by SIGTERM; seen between two steps, never inside one
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        _loop(listener, keeper, idle_s, stopping)
    finally:
        path.unlink(missing_ok=True)
        keeper.close()


def _loop(
    listener: socket.socket, keeper: Keeper, idle_s: float, stopping: threading.Event
) -> None:
    chosen = selectors.DefaultSelector()
    chosen.register(listener, selectors.EVENT_READ)
    while not stopping.is_set() and not keeper.done(idle_s):
        keeper.tend()
        for key, _events in chosen.select(timeout=1.0):
            connection = key.fileobj
            assert isinstance(connection, socket.socket)
            if connection is listener:
                accepted, _peer = listener.accept()
                if keeper.answer(accepted):
                    chosen.register(accepted, selectors.EVENT_READ)
                else:
                    accepted.close()
            else:  # the borrower closed it (or wrote, which it never should)
                chosen.unregister(connection)
                keeper.give_back(connection)


def _conditions(data: Any) -> Conditions | None:
    """The conditions a command sent (None: no `Conditions` object, as no keeper's)."""
    try:
        return Conditions.from_json(data) if isinstance(data, dict) else None
    except (KeyError, TypeError, ValueError):
        return None


if __name__ == "__main__":
    serve(Conditions.from_json(json.loads(sys.argv[1])), *(float(arg) for arg in sys.argv[2:3]))
