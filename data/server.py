"""Regeneration through OpenAI-compatible servers (`data.backend: server`): vLLM, SGLang, `eyas serve`.

Each prompt goes as TOKEN IDS (rendered by eyas with the target's chat template) to
`POST {url}/v1/completions` and the generated token ids come back as the server produced them,
never re-tokenized from text. The request and response fields are vLLM's (SGLang's OpenAI server
and `eyas serve` take the same):

    request   {"model", "prompt": [ids], "max_tokens", "temperature", "top_p", "seed",
               "stop_token_ids": eos ids, "return_token_ids": true}            (vLLM >= 0.10.2)
    response  {"choices": [{"token_ids": [generated ids], "finish_reason": "stop" | "length", ...}]}

Several URLs form a data-parallel fleet: each URL runs `data.server_concurrency` requests at
a time, workers take the next prompt from one queue. A request that fails with a connection error
or a 5xx is retried with exponential backoff (a server restarting loses nothing); a 4xx fails the
stage with the server's message.

No request has a time limit of its own: behind the others in a server's queue, a long prompt may wait
tens of minutes for its answer on a CPU, and a client that gives up on it and sends it again sends it to
the back of the queue: with httpx's 600 s read limit per request, the SmolLM2 long-context recipe's last
64 prompts (up to 8K tokens, all in flight) got no answer for 49 minutes on a 2-core CPU. Instead each
server must keep answering: its /health is asked every HEALTH_EVERY_S (an answer below 500 counts, as does
a finished request), and one that answers nothing for `data.server_timeout_s`, or holds requests and
finishes none for `data.server_stall_s` (a hung engine whose /health still answers), stops the stage,
naming it (the finished parts are kept).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import httpx

from eyas.infra.errors import RunError

BACKOFF_S, BACKOFF_MAX_S = 0.5, 30.0
HEALTH_EVERY_S = 2.0
PROBE_TIMEOUT_S = 10.0  # one /health probe (a busy vLLM answers it from its API process in milliseconds)


class ServerError(RunError, RuntimeError):
    """A server refused a request (4xx) or kept failing after every retry."""


async def served_model(client: httpx.AsyncClient, url: str) -> str:
    """The first model a server lists at /v1/models (what `vllm serve MODEL` serves)."""
    try:
        r = await client.get(f"{url}/v1/models")
        r.raise_for_status()
    except httpx.HTTPError as e:
        raise ServerError(f"{url}/v1/models: {type(e).__name__}: {e}") from e
    return r.json()["data"][0]["id"]


async def answers(probe: httpx.AsyncClient, url: str) -> bool:
    """Whether `url` answers GET /health below 500 (a server without /health answers 404; vLLM answers 503
    once its engine has died)."""
    try:
        return (await probe.get(f"{url}/health")).status_code < 500
    except httpx.TransportError:  # refused, reset, timed out
        return False


class Liveness:
    """When each server last answered (a /health probe, a completion) and last finished a request while it
    held some: a server silent for `timeout_s`, or holding requests without finishing any for `stall_s`
    (its /health answering while its engine hangs), stops the stage."""

    def __init__(self, urls: list[str], timeout_s: float, stall_s: float):
        now = time.monotonic()
        self.timeout_s, self.stall_s = timeout_s, stall_s
        self.answered = dict.fromkeys(urls, now)
        self.finished = dict.fromkeys(urls, now)
        self.in_flight = dict.fromkeys(urls, 0)

    def sent(self, url: str) -> None:
        self.in_flight[url] += 1
        if self.in_flight[url] == 1:  # the wait for a finished request starts now
            self.finished[url] = time.monotonic()

    def done(self, url: str) -> None:
        self.in_flight[url] -= 1
        self.answered[url] = self.finished[url] = time.monotonic()

    def probed(self, url: str, answered: bool) -> None:
        """After a probe of `url`: ServerError when it has been silent or stalled too long."""
        now = time.monotonic()
        if answered:
            self.answered[url] = now
        if now - self.answered[url] > self.timeout_s:
            raise ServerError(
                f"{url} has answered nothing for {now - self.answered[url]:.0f} s (data.server_timeout_s): "
                "the finished parts are kept; run the stage again"
            )
        if self.in_flight[url] and now - self.finished[url] > self.stall_s:
            raise ServerError(
                f"{url} holds {self.in_flight[url]} requests and has finished none for "
                f"{now - self.finished[url]:.0f} s (data.server_stall_s): the finished parts are kept"
            )


async def complete(client: httpx.AsyncClient, url: str, body: dict, retries: int) -> dict:
    """One completion with retries on connection errors (a connect timeout included) and 5xx. -> the first
    choice."""
    for attempt in range(retries + 1):
        try:
            r = await client.post(f"{url}/v1/completions", json=body)
            if r.status_code < 500:
                if r.status_code >= 400:
                    raise ServerError(f"{url}/v1/completions answered {r.status_code}: {r.text[:500]}")
                choice = r.json()["choices"][0]
                if choice.get("token_ids") is None:
                    raise ServerError(
                        f"{url}: the response carries no token_ids; the server must support "
                        "`return_token_ids` (vLLM >= 0.10.2, SGLang, eyas serve)"
                    )
                return choice
            error = f"{r.status_code}: {r.text[:200]}"
        except httpx.TransportError as e:  # refused, reset, timed out
            error = f"{type(e).__name__}: {e}"
        if attempt == retries:
            raise ServerError(f"{url}/v1/completions failed {retries + 1} times, last: {error}")
        await asyncio.sleep(min(BACKOFF_MAX_S, BACKOFF_S * 2**attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def regenerate_through_servers(
    urls: list[str],
    model: str | None,
    jobs: list[tuple],
    params: dict,
    eos_ids: list[int],
    concurrency: int,
    timeout_s: float,
    retries: int,
    on_done: Callable,
    health: Callable[[], None] | None = None,
    stall_s: float = 4 * 3600.0,
) -> None:
    """Send every job (key, seed, prompt ids) to the fleet. `on_done(key, prompt ids, generated ids,
    finish_reason)` is called in the caller's thread as each one completes (in any order); it may return
    a follow-up job (the conversation's next turn), which joins the queue. Workers take the job with the
    smallest key first (keys are ordered tuples, a part's index first): a follow-up turn goes ahead of every
    later conversation's first turn, so parts finish in order and a stopped stage keeps all but the parts in
    flight (first in, first out, no part would finish before every first turn had been answered).
    `health()`, called every HEALTH_EVERY_S while they run, raises when a server eyas started has died (it
    ends the stage at once, instead of after every retry); so does a server that answers nothing for
    `timeout_s` or holds requests without finishing any for `stall_s` (Liveness)."""

    urls = [u.rstrip("/") for u in urls]

    async def main():
        queue: asyncio.PriorityQueue = asyncio.PriorityQueue()
        for job in jobs:
            queue.put_nowait(job)
        limits = httpx.Limits(max_connections=concurrency * len(urls), max_keepalive_connections=concurrency)
        # no read limit: an answer takes as long as the server's queue makes it (the module's docstring)
        timeout, short = httpx.Timeout(timeout_s, read=None), min(PROBE_TIMEOUT_S, timeout_s)
        live = Liveness(urls, timeout_s, stall_s)
        async with (
            httpx.AsyncClient(timeout=timeout, limits=limits) as client,
            httpx.AsyncClient(timeout=short) as probe,  # its own connections: never queued behind completions
        ):
            names = {u: model or await served_model(probe, u) for u in urls}

            async def worker(url: str):
                while True:
                    key, seed, ids = await queue.get()
                    body = {
                        "model": names[url],
                        "prompt": ids,
                        "seed": seed,
                        "stop_token_ids": eos_ids,
                        "return_token_ids": True,
                        **params,
                    }
                    live.sent(url)
                    choice = await complete(client, url, body, retries)
                    live.done(url)
                    follow = on_done(key, ids, list(choice["token_ids"]), choice.get("finish_reason"))
                    if follow is not None:
                        queue.put_nowait(follow)
                    queue.task_done()

            async def watch():  # ends only by raising
                while True:
                    if health is not None:
                        health()
                    for url, ok in zip(urls, await asyncio.gather(*(answers(probe, u) for u in urls))):
                        live.probed(url, ok)
                    await asyncio.sleep(HEALTH_EVERY_S)

            # created in turn (url 0, 1, ..., 0, 1, ...): the queue serves waiting workers first come, first
            # served, so fewer prompts than workers still spread over every server
            tasks = [asyncio.create_task(worker(u)) for _ in range(concurrency) for u in urls]
            tasks.append(asyncio.create_task(watch()))
            joined = asyncio.create_task(queue.join())
            try:  # workers only end by failing: the first failure ends the stage
                await asyncio.wait([joined, *tasks], return_when=asyncio.FIRST_COMPLETED)
                for t in tasks:
                    if t.done():
                        t.result()
            finally:
                for t in [joined, *tasks]:
                    t.cancel()

    asyncio.run(main())
