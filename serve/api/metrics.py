"""Prometheus metrics on /metrics, named as vLLM names them (vllm/v1/metrics/loggers.py and
vllm/v1/spec_decode/metrics.py), so the same scrape reads eyas and vLLM alike
(`eyas eval --server` reads acceptance this way from either).

    vllm:spec_decode_num_drafts_total                      verifications
    vllm:spec_decode_num_draft_tokens_total                draft tokens proposed (k, or N-1 for a tree)
    vllm:spec_decode_num_accepted_tokens_total             draft tokens accepted (and emitted)
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}   verifications accepting > i drafts
        mean acceptance length = 1 + accepted / drafts (vLLM's own log line)
    vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:request_success_total{finished_reason}
    vllm:num_requests_running, vllm:num_requests_waiting
    vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds, vllm:e2e_request_latency_seconds

Labels: model_name (the served name) and engine ("0"), as vLLM. One registry per server, so
several servers can live in one process (tests).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)


class ServerMetrics:
    def __init__(self, model_name: str, num_positions: int):
        self.registry = CollectorRegistry()
        lab = {"model_name": model_name, "engine": "0"}
        names = list(lab)
        r = self.registry

        def counter(name, doc, extra=()):
            return Counter(name, doc, names + list(extra), registry=r)

        def histogram(name, doc):
            return Histogram(name, doc, names, buckets=LATENCY_BUCKETS, registry=r).labels(**lab)

        self.drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.").labels(**lab)
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.").labels(
            **lab
        )
        self.accepted = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.").labels(
            **lab
        )
        per_pos = counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            ["position"],
        )
        self.per_pos = [per_pos.labels(**lab, position=str(i)) for i in range(num_positions)]
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(
            **lab
        )
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        ).labels(**lab)
        self._success = counter(
            "vllm:request_success", "Count of successfully processed requests.", ["finished_reason"]
        )
        self._lab = lab
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", names, registry=r
        ).labels(**lab)
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", names, registry=r
        ).labels(**lab)
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."
        )

    def verification(self, proposed: int, accepted: int) -> None:
        self.drafts.inc()
        self.draft_tokens.inc(proposed)
        self.accepted.inc(accepted)
        for i in range(min(accepted, len(self.per_pos))):
            self.per_pos[i].inc()

    def finished(self, reason: str, prompt_tokens: int, generated: int, e2e_s: float) -> None:
        self._success.labels(**self._lab, finished_reason=reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generated)
        self.e2e.observe(e2e_s)
