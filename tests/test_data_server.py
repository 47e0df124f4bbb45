"""`data.backend: server`: regeneration through an OpenAI-compatible server (`eyas serve` on
127.0.0.1, started and stopped here) keeps the server's token ids, equals the HF backend under
greedy decoding, and loses nothing when the server dies mid-run and comes back."""

import http.server
import shutil
import signal
import threading
import time

import httpx
import pytest
from data_fixtures import DEMO_SMALL, write_conversations
from serve_process import eyas_serve, free_port, silent_server

from eyas.data.prompts import run_prompts
from eyas.data.regenerate import read_sequences, run_regenerate
from eyas.data.server import ServerError, regenerate_through_servers
from eyas.infra.layout import read_done
from eyas.recipes.load import load_recipe

BASE = DEMO_SMALL


def demo_server(port: int, log_path):
    """`eyas serve demo`, the target alone."""
    return eyas_serve(
        ["demo", "--no-speculation", "--max-num-seqs", "4", "target.dtype=float32", "target.device=cpu"],
        port,
        log_path,
    )


@pytest.fixture(scope="module")
def prompted(tmp_path_factory):
    root = tmp_path_factory.mktemp("server-regen")
    run_prompts(load_recipe("demo", BASE), root / "run", progress=False)
    hf = root / "hf"
    shutil.copytree(root / "run", hf)
    run_regenerate(load_recipe("demo", BASE), hf, progress=False, part_batches=1)
    return root


def server_recipe(port: int, *extra):
    return load_recipe(
        "demo",
        BASE
        + [
            "data.backend=server",
            f"data.server_urls=[http://127.0.0.1:{port}/]",
            "data.server_concurrency=3",
            *extra,
        ],
    )


def test_greedy_through_the_server_equals_the_hf_backend(prompted, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(prompted / "run", run)
    port = free_port()
    with demo_server(port, tmp_path / "serve.log"):
        stats = run_regenerate(server_recipe(port), run, progress=False, part_batches=1)
    hf = read_sequences(prompted / "hf")
    assert stats["backend"] == "server" and stats["num_sequences"] == len(hf) == 8
    assert read_sequences(run) == hf  # the same token ids, prompt lengths and finished flags, part by part
    assert sorted(p.name for p in (run / "regenerate").glob("part-*")) == sorted(
        p.name for p in (prompted / "hf" / "regenerate").glob("part-*")
    )
    assert read_done(run, "regenerate")["generation_tokens_per_s"] > 0


def test_a_server_that_dies_mid_run_and_comes_back_loses_nothing(prompted, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(prompted / "run", run)
    port = free_port()
    result = {}

    def regenerate():
        try:
            result["stats"] = run_regenerate(
                server_recipe(port, "data.server_concurrency=1", "data.server_retries=10"),
                run,
                progress=False,
                part_batches=1,
            )
        except BaseException as e:  # noqa: BLE001 -- reported below
            result["error"] = e

    with demo_server(port, tmp_path / "serve.log") as proc:
        worker = threading.Thread(target=regenerate)
        worker.start()
        parts = run / "regenerate"
        for _ in range(600):  # the first part lands, then the server dies
            if list(parts.glob("part-*.jsonl")) or not worker.is_alive():
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    written_before = len(list(parts.glob("part-*.jsonl")))
    assert 1 <= written_before < 4
    time.sleep(1.0)
    with demo_server(port, tmp_path / "serve.log"):  # back on the same port
        worker.join(timeout=300)
    assert not worker.is_alive() and "error" not in result, result.get("error")
    assert read_sequences(run) == read_sequences(prompted / "hf")


def test_a_server_that_never_answers_fails_naming_it(prompted, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(prompted / "run", run)
    port = free_port()  # nothing listens there
    with pytest.raises(Exception, match=rf"http://127.0.0.1:{port}"):
        run_regenerate(
            server_recipe(port, "data.server_retries=1", "data.server_model=demo"), run, progress=False
        )
    assert not list((run / "regenerate").glob("part-*"))


def test_multi_turn_conversations_through_the_server_equal_the_hf_backend(tmp_path):
    """Each conversation's next turn goes to the server when its answer is back; greedy: the HF rows."""
    conversations = write_conversations(tmp_path / "conversations.jsonl")
    multi = [f"data.prompts={conversations}", "data.max_new_tokens=48", "data.batch_size=3"]
    hf = tmp_path / "hf"
    r = load_recipe("demo", BASE + multi)
    run_prompts(r, hf, progress=False)
    shutil.copytree(hf, tmp_path / "server")
    hf_stats = run_regenerate(r, hf, progress=False, part_batches=1)
    port = free_port()
    with demo_server(port, tmp_path / "serve.log"):
        stats = run_regenerate(
            server_recipe(port, *multi), tmp_path / "server", progress=False, part_batches=1
        )
        order = turn_order(f"http://127.0.0.1:{port}")
    assert stats["num_sequences"] == hf_stats["num_sequences"] > stats["num_conversations"] == 6
    assert read_sequences(tmp_path / "server") == read_sequences(hf)
    # one request at a time: a conversation's second turn goes before any later conversation's first, so a
    # part finishes before the next starts (first in, first out: every first turn, then the second turns)
    assert order == [(p, i, turn) for p in range(2) for i in range(2) for turn in range(2)]


def turn_order(url: str) -> list[tuple]:
    """Two parts of two two-turn conversations through the server one request at a time -> the order the
    turns were answered in, as (part, conversation, turn)."""
    done = []

    def on_done(key, ids, generated, finish_reason):
        done.append(key)
        p, i, turn = key
        return ((p, i, 1), 0, ids + generated + [5, 6]) if turn == 0 else None

    jobs = [((p, i, 0), 0, [1, 10 + p, 20 + i]) for p in range(2) for i in range(2)]
    params = {"max_tokens": 4, "temperature": 0.0, "top_p": 1.0}
    regenerate_through_servers([url], None, jobs, params, [0], 1, 60.0, 1, on_done)
    return done


def test_an_answer_slower_than_the_timeout_is_waited_for(tmp_path):
    """data.server_timeout_s bounds how long a server may answer nothing, not a request: 16 requests in flight
    on a server that decodes one at a time, the later ones wait several times the 2 s limit, and each is
    answered once (retries allowed: a request given up on is sent again and counted again by the server),
    every answer whole. Before, the limit was each request's: the first answer over it was given up on (on
    a 2-core CPU, 64 long prompts in flight were sent again and again until none finished)."""
    port, n, limit = free_port(), 16, 2.0
    done = {}

    def on_done(key, ids, generated, finish_reason):
        done[key] = (time.monotonic() - t0, len(generated))

    jobs = [((i,), 0, [1, 10 + i, 20 + i]) for i in range(n)]
    params = {"max_tokens": 128, "temperature": 0.0, "top_p": 1.0, "ignore_eos": True}
    with eyas_serve(["demo", "--no-speculation", "--max-num-seqs", "1", *BASE], port, tmp_path / "s.log"):
        url = f"http://127.0.0.1:{port}"
        t0 = time.monotonic()
        regenerate_through_servers([url], None, jobs, params, [], n, limit, 2, on_done)
        served = httpx.get(f"{url}/metrics", timeout=10).text
    print({k[0]: round(t, 2) for k, (t, _) in sorted(done.items())})
    assert sorted(done) == [(i,) for i in range(n)] and all(m == 128 for _, m in done.values()), done
    assert max(t for t, _ in done.values()) > 2 * limit, done  # sent at once, answered one at a time
    answered = [line for line in served.splitlines() if line.startswith("vllm:request_success_total")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in answered) == n, answered


def stopped_within(seconds: float, *args) -> BaseException | None:
    """regenerate_through_servers(*args) in a thread -> what it raised; the test fails instead of hanging
    when it has not stopped within `seconds`."""
    out = {}

    def run():
        try:
            regenerate_through_servers(*args)
        except BaseException as e:  # noqa: BLE001 -- returned
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return out.get("error")


@pytest.mark.parametrize("model", [None, "m"], ids=["asks-its-model", "model-given"])
def test_a_server_that_answers_nothing_stops_the_stage_naming_it(model):
    """A server that takes the connection and never answers (neither /v1/models, the completion nor /health)
    ends the stage after data.server_timeout_s, naming it, instead of waiting forever."""
    with silent_server() as port:
        url = f"http://127.0.0.1:{port}"
        t0 = time.monotonic()
        error = stopped_within(
            60, [url], model, [((0,), 0, [1, 2])], {"max_tokens": 4}, [0], 1, 2.0, 0, print
        )
    assert isinstance(error, ServerError) and url in str(error), error
    assert ("answered nothing for" in str(error)) == (model is not None)  # else /v1/models timed out
    assert time.monotonic() - t0 >= 2.0


class HungEngine(http.server.BaseHTTPRequestHandler):
    """A server whose /health answers and whose completions never come back (an engine hung behind a live
    API process)."""

    def do_GET(self):  # noqa: N802 -- http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):  # noqa: N802
        time.sleep(3600)

    def log_message(self, *args):
        pass


def test_a_server_that_finishes_nothing_stops_the_stage_after_the_stall_limit():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HungEngine)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        jobs = [((i,), 0, [1, 2]) for i in range(3)]
        error = stopped_within(60, [url], "m", jobs, {"max_tokens": 4}, [0], 2, 2.0, 0, print, None, 3.0)
    finally:
        server.shutdown()
    assert isinstance(error, ServerError), error
    assert f"{url} holds 2 requests and has finished none for" in str(error), error
