"""The OpenAI-compatible server from Python.

    python -m deepinfer.serve --model DIR [--host 127.0.0.1] [--port 8000] [engine flags]

runs ``deepinfer serve`` (the C++ server, docs/SERVER.md) with the same arguments. From code,
``launch()`` starts one on a free loopback port and returns a handle with its ``base_url``:

    with deepinfer.serve.launch(["--model", "assets/default-model"]) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="none")

The executable is found at $DEEPINFER_CLI, then ``deepinfer`` on PATH, then ``build*/deepinfer``
in the source tree this package lives in.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional, Sequence

_ROOT = Path(__file__).resolve().parent.parent.parent


def find_executable() -> str:
    """Path of the ``deepinfer`` executable; FileNotFoundError naming where it looked."""
    cands = [os.environ.get("DEEPINFER_CLI"), shutil.which("deepinfer")]
    cands += sorted(glob.glob(str(_ROOT / "build*" / "deepinfer")), key=lambda p: -os.path.getmtime(p))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError("deepinfer executable not found: set DEEPINFER_CLI, put `deepinfer` on PATH, "
                            f"or build it (./build.sh) under {_ROOT}")


class ServerProcess:
    """A running ``deepinfer serve``; stop() (or leaving the ``with`` block) ends it with SIGTERM."""

    def __init__(self, proc: subprocess.Popen, host: str, port: int, log: List[str]):
        self.proc, self.host, self.port, self.log = proc, host, port, log

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_command(command: str, args: Sequence[str] = (), timeout: float = 120,
                  env: Optional[dict] = None) -> ServerProcess:
    """Starts ``deepinfer COMMAND ARGS`` -- a command that prints ``listening on http://HOST:PORT``
    (``serve``, ``router``) -- and waits until it listens; its stderr is kept in ``.log``.

    RuntimeError with the command's output when it exits or does not listen within `timeout`."""
    exe = find_executable()
    proc = subprocess.Popen([exe, command, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)
    log: List[str] = []
    found: List[re.Match] = []
    ready = threading.Event()

    def pump() -> None:  # keeps reading stderr so the process never blocks on a full pipe
        for line in proc.stderr:
            log.append(line)
            m = re.search(r"listening on http://([^:\s]+):(\d+)", line)
            if m and not found:
                found.append(m)
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.time() + timeout
    while not ready.wait(0.1):
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"deepinfer {command} did not start listening in time:\n" + "".join(log))
    if not found:
        proc.wait()
        raise RuntimeError(f"deepinfer {command} exited with {proc.returncode}:\n" + "".join(log))
    return ServerProcess(proc, found[0].group(1), int(found[0].group(2)), log)


def launch(args: Sequence[str] = (), host: str = "127.0.0.1", timeout: float = 120,
           env: Optional[dict] = None) -> ServerProcess:
    """Starts ``deepinfer serve ARGS --host HOST --port 0`` and waits until it listens.

    RuntimeError with the server's output when it exits or does not listen within `timeout`."""
    return start_command("serve", [*args, "--host", host, "--port", "0"], timeout, env)


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    exe = find_executable()
    os.execv(exe, [exe, "serve", *argv])


if __name__ == "__main__":
    main()
