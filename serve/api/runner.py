"""The engine loop in a background thread, fed by the HTTP server's event loop.

Requests are handed over through a queue and joined between engine steps (continuous batching);
a request's emitted tokens come back through its `on_tokens` callback, which runs on the engine
thread and hands them to the waiting handler's asyncio queue (`loop.call_soon_threadsafe`).
Two engines may run side by side (with and without the draft, for requests that turn
speculation off); the thread steps whichever has work. An exception inside a step fails the
requests in flight with its message instead of killing the server.
"""

from __future__ import annotations

import queue
import threading
import traceback

from eyas.serve.decoding.engine import Engine, Request


class EngineRunner:
    def __init__(self, engines: dict[str, Engine], metrics=None):
        self.engines = engines
        self.metrics = metrics
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wake = threading.Event()
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, name="eyas-engine", daemon=True)
        self.thread.start()

    def submit(self, engine: str, req: Request) -> None:
        self.inbox.put(("add", engine, req))
        self.wake.set()

    def abort(self, req: Request) -> None:
        self.inbox.put(("abort", None, req))
        self.wake.set()

    def stop(self) -> None:
        self.stopped = True
        self.wake.set()
        self.thread.join(timeout=10)
        for e in self.engines.values():
            e.close()

    def _loop(self) -> None:
        while not self.stopped:
            self._drain()
            busy = [e for e in self.engines.values() if e.busy]
            if self.metrics is not None:
                self.metrics.running.set(sum(len(e.rows) for e in self.engines.values()))
                self.metrics.waiting.set(sum(len(e.waiting) for e in self.engines.values()))
            if not busy:
                self.wake.wait(timeout=0.5)
                self.wake.clear()
                continue
            for engine in busy:
                try:
                    engine.step()
                except Exception as e:  # noqa: BLE001  (one bad step must not take the server down)
                    traceback.print_exc()
                    self._fail(engine, f"engine error: {type(e).__name__}: {e}")

    def _drain(self) -> None:
        while True:
            try:
                op, name, req = self.inbox.get_nowait()
            except queue.Empty:
                return
            if op == "add":
                try:
                    self.engines[name].add(req)
                except Exception as e:  # noqa: BLE001
                    self._finish_with_error(req, str(e))
            else:
                for engine in self.engines.values():
                    if any(r is req for r in engine.waiting) or any(r is req for r in engine.rows):
                        engine.abort(req)

    def _fail(self, engine: Engine, message: str) -> None:
        for req in list(engine.rows) + list(engine.waiting):
            self._finish_with_error(req, message)
        engine.waiting.clear()
        engine.retire()

    @staticmethod
    def _finish_with_error(req: Request, message: str) -> None:
        req.error = message
        req.finish_reason = req.finish_reason or "abort"
        if req.on_tokens is not None:
            req.on_tokens(req, [])
