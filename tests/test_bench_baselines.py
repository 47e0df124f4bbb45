"""benchmarks/bench_baselines.py's rows from vLLM's counters: tau, per benchmark, accepted per position, the
speedup and the time of a target step (no vLLM run: the counters are written out here)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_baselines  # noqa: E402


def run(outputs, generate_s, per_request):
    counters = bench_baselines.summed(per_request)
    return {"outputs": outputs, "generate_s": generate_s, "counters": counters, "per_request": per_request}


def test_rows_count_tau_acceptance_and_step_time():
    """Two prompts (mt-bench, gsm8k) of 10 tokens each. plain: 20 steps in 2.0 s (100 ms a step). The
    draft: 4 verifications with drafts of 3, 6 drafts accepted (3 + 1 at the first prompt's, 2 at the
    other's), one output parted from plain; its steps are the larger of 20 - 6 = 14 and 2 prefills + 4 = 6."""
    a, b = list(range(10)), list(range(10, 20))
    plain = run([a, b], 2.0, [{"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}] * 2)
    draft = run(
        [a, b[:9] + [99]],
        1.0,
        [
            {"drafts": 2, "draft_tokens": 6, "accepted": 4, "per_pos": [2, 1, 1]},
            {"drafts": 2, "draft_tokens": 6, "accepted": 2, "per_pos": [1, 1]},
        ],
    )
    rows = bench_baselines.rows({"plain": plain, "eyas": draft}, ["mt-bench", "gsm8k"], concurrency=1)
    assert rows[0] == {
        "run": "plain",
        "concurrency": 1,
        "tok_s": 10.0,
        "verifications with drafts": 0,
        "ms a step": 100.0,
        "speedup": 1.0,
        "same as plain": "2/2",
    }
    assert rows[1] == {
        "run": "eyas",
        "concurrency": 1,
        "tok_s": 20.0,
        "verifications with drafts": 4,
        "ms a step": round(1000 / 14, 1),
        "speedup": 2.0,
        "same as plain": "1/2",
        "tau": 2.5,
        "accepted per position": "0.75 / 0.50 / 0.25",
        "tau mt-bench": 3.0,
        "tau humaneval": "—",
        "tau gsm8k": 2.0,
    }
    at8 = bench_baselines.rows({"plain": plain, "eyas": draft}, ["mt-bench", "gsm8k"], concurrency=8)
    assert "ms a step" not in at8[1]  # a step's time is its own only one request at a time


def test_steps_where_accepted_drafts_fall_past_the_end():
    """vLLM counts drafts accepted past max_tokens: 12 tokens, 9 accepted, 4 verifications: tokens -
    accepted (3) is below one prefill + 4 verifications (5), which counts."""
    r = {"outputs": [list(range(12))], "counters": {"accepted": 9, "drafts": 4}}
    assert bench_baselines.steps(r) == 5


def test_table_reprints_a_written_report(tmp_path, capsys):
    """--table REPORT: the rows counted again from the report's raw results (one prompt of each benchmark,
    in BENCHMARKS' order), printed as the run printed them."""
    zero = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    one = {"drafts": 1, "draft_tokens": 3, "accepted": 3, "per_pos": [1, 1, 1]}
    outs = [list(range(4))] * 3
    results = {"plain": run(outs, 1.2, [zero] * 3), "eyas": run(outs, 0.3, [one] * 3)}
    path = tmp_path / "report.json"
    path.write_text(bench_baselines.json.dumps({"args": {"prompts": 1}, "results": {"1": results}}))
    bench_baselines.retable(path)
    expected = bench_baselines.table(bench_baselines.rows(results, list(bench_baselines.BENCHMARKS), 1))
    assert capsys.readouterr().out == expected + "\n"
    row = "| eyas | 1 | 4.0 | 4.0 | 4.0 | 4.0 | 1.00 / 1.00 / 1.00 | 3 | 40.0 | 4.0 | 3/3 | 50.0 |"
    assert row in expected  # 12 tokens in 0.3 s over 6 steps (3 prefills + 3 verifications)
