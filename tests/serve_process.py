"""`eyas serve` as a subprocess on 127.0.0.1 for the tests that talk to it: started, waited for
(/health), and always stopped."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def eyas_serve(args: list[str], port: int, log_path):
    """`python -m eyas serve ARGS --host 127.0.0.1 --port PORT` until the block ends; yields the process."""
    log = open(log_path, "a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "eyas", "serve", *args, "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        for _ in range(240):
            if proc.poll() is not None:
                raise RuntimeError("eyas serve exited:\n" + open(log_path).read())
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError("eyas serve did not come up:\n" + open(log_path).read())
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


@contextmanager
def silent_server():
    """A server that takes connections and never answers (the kernel accepts them; nothing reads them):
    yields its port."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]
