"""`eyas plan`: the gpt-oss-120b figures against hand computations from its published dimensions."""

import pytest

from eyas.plan.command import plan
from eyas.plan.cost import Assumptions, parse_gpus
from eyas.plan.report import render
from eyas.recipes.load import load_recipe

H, V, L, E, I_EXPERT, I_DRAFT, VD = 2880, 201088, 36, 128, 2880, 17280, 32000
# the draft's hidden matrices: fc, attention (q, k, v, o), MLP
MATRICES = 3 * H * H + 2 * H * 4096 + 2 * (2 * H * 512) + 4096 * H + 3 * H * I_DRAFT


def hand_target():
    attn = (H * 4096 + 4096) + 2 * (H * 512 + 512) + (4096 * H + H) + 64  # q, k, v, o with biases; sinks
    router = E * H + E
    experts_w = E * (H * 2 * I_EXPERT + I_EXPERT * H)  # gate_up, down (MXFP4 in the checkpoint)
    experts_b = E * (2 * I_EXPERT + H)
    layer = attn + router + experts_w + experts_b + 2 * H  # two norms
    total = L * layer + 2 * V * H + H  # embedding, lm_head, final norm
    return total, L * experts_w


def test_gpt_oss_120b_plan_on_8xh100_matches_hand_computation():
    r = load_recipe("gpt-oss-120b")
    p = plan(r, "8xH100")
    total, experts = hand_target()
    assert (total, experts) == (116_829_156_672, 114_661_785_600)
    assert p.target.params == total and p.target.expert_params == experts
    assert p.target.bytes_mxfp4 == experts * 4.25 / 8 + (total - experts) * 2  # 65.25 GB
    assert p.target.bytes_bf16 == 2 * total
    assert p.target_gb_per_gpu["bf16"] == pytest.approx(2 * total / 8 / 1e9)
    draft = MATRICES + 3 * H + H + 3 * H  # the norms: input_norm (norm_before_fc) over the three aux states
    # draft.lm_head: target_frozen: the target's lm_head rows of the draft vocab, frozen
    assert p.draft_trainable == draft == 215_490_240 and p.draft_frozen == V * H + H * VD
    a = Assumptions()
    tokens = 100_000 * (400 + 0.75 * 2048)  # num_prompts x (assumed prompt + generated)
    assert p.tokens == tokens
    # the suite runs offline (tests/conftest.py): the hub dataset could not be streamed, and the plan says so
    unread = "data: 100,000 sequences x 1,936 tokens (assumed mean; HuggingFaceH4/ultrachat_200k not read: "
    assert unread in render(r, p)
    assert p.capture_bytes_per_token == 4 * H * 2 + 5  # 3 aux + final, bf16, + token id and loss mask
    assert p.capture_bytes == tokens * 23_045
    # fp32 weights + grads, Muon's momentum on the matrices and AdamW's two moments on the norms; the fp32
    # frozen embedding and lm_head rows; the fp32 teacher lm_head and its bf16 copy, kept (teacher_weight)
    static = 8 * draft + 4 * MATRICES + 8 * (draft - MATRICES) + 4 * (V * H + H * VD) + 4 * V * H + 2 * V * H
    # the teacher (train/ttt.py target_view): fp32 over the draft vocabulary, argmax, mass and flag at every
    # position, held through the step; its lm_head chunks (128 positions of 10 V + 4 V_d bytes at most) are
    # gone before the unroll, whose activations are larger here
    teacher = 4096 * (4 * VD + 13)
    scratch = 128 * (10 * V + 4 * VD)
    unrolled = a.act_bytes_per_token_step * 4096 * 1 * 5
    assert p.train_teacher_gb * 1e9 == pytest.approx(teacher) and unrolled > scratch
    assert p.train_gb_per_gpu * 1e9 == pytest.approx(static + unrolled + teacher)
    # MXFP4 65.25 GB fits one H100 (72 GB with 10% headroom): 8 replicas, one shard each
    assert (p.replicas, p.gpus_per_replica) == (8, 1)
    # the recipe regenerates through vLLM (data.backend: vllm); with HF generate it would take 20x longer
    assert p.regen_s == pytest.approx(100_000 * 0.75 * 2048 / (8 * a.regen_tok_s_server_h100))
    hf = plan(load_recipe("gpt-oss-120b", ["data.backend=hf"]), "8xH100")
    assert hf.regen_s == pytest.approx(100_000 * 0.75 * 2048 / (8 * a.regen_tok_s_hf_h100))
    # capture's forward (eyas/plan/flops.py): 2 FLOPs a weight a token, 4 of 128 experts, embedding and
    # lm_head apart (capture stops at the lm_head's input); attention over each sequence alone (vLLM,
    # causal) in 18 full layers and 18 of a 128-token window, 64 heads x 64 wide: 4 x 4,096 FLOPs a pair
    linear = 2 * ((total - experts - 2 * V * H) + experts * 4 / 128)
    n = 1936  # every sequence the assumed mean long (the hub source is not read)
    pairs = 18 * n * (n + 1) / 2 + 18 * (128 * 129 / 2 + (n - 128) * 128)
    assert p.capture_work.attention == pytest.approx(100_000 * 4 * 4096 * pairs)
    # 12,500 batches of 8 over 8 replicas: the first shard holds 1,563 of them (12,504 sequences), and the
    # capture lasts as long as it does
    per_replica = 0.30 * 989e12 * n / (linear * n + 4 * 4096 * pairs)
    assert p.capture_tok_s == pytest.approx(8 * per_replica * 12_500 / 12_504)
    bf16 = plan(
        load_recipe(
            "gpt-oss-120b",
            [
                "target.weights=dequantized",
                "data.backend=server",
                "data.server_urls=[http://127.0.0.1:8000]",
                "capture.backend=hf",
            ],
        ),
        "8xH100",
    )
    assert (bf16.replicas, bf16.gpus_per_replica) == (2, 4)  # 233.7 GB over 4 x 72 GB
    assert bf16.regen_tok_s == pytest.approx(2 * a.regen_tok_s_server_h100)
    # 2 epochs at T = 4K; TTT 5 runs 7/5 the tokens of the TTT 7 measurement
    # (the 2% of conversations train.val_fraction holds out for tuning are not trained on)
    assert p.train_s == pytest.approx(2 * 0.98 * tokens / (8 * 22.3e3 * 7 / 5))
    # what limits the run: offline training reads the 4.46 TB capture at 23,045 B x 249,760 tok/s = 5.76 GB/s;
    # DDP all-reduces 4 B x 215.49M fp32 gradients a step, a ring sending 2 x 7/8 of them each way at 450 GB/s
    assert p.read_bytes_s == pytest.approx(23_045 * p.train_tok_s) and p.read_bytes_s / 1e9 == pytest.approx(
        5.76, abs=0.005
    )
    assert p.allreduce_bytes == 4 * draft and p.allreduce_s == pytest.approx(2 * 7 / 8 * 4 * draft / 450e9)
    # online: a producer GPU makes 249,597 / 8 = 31,200 tok/s, a trainer takes 31,220: 4 : 4 trains fastest
    o = p.online
    assert (o.producer_gpus, o.trainer_gpus) == (4, 4) and o.tok_s == pytest.approx(4 * 249_597 / 8, rel=1e-4)
    assert o.train_s == pytest.approx(2 * 0.98 * tokens / o.tok_s) and o.train_s > p.capture_s + p.train_s
    text = render(r, p)
    assert "time: regeneration 2.7 h at 16,000 tok/s (assumed, data.backend vllm, with CUDA graphs)" in text
    assert "target replicas: 8 vLLM engine(s) of 1 GPU(s) each" in text
    assert "storage: an offline capture 4.46 TB; offline training reads it at 5.76 GB/s" in text
    assert "online from vLLM (capture.mode: online, capture.backend: vllm): 4 producer GPU(s)" in text
    assert (
        "offline 38.2 min (capture 12.9 min + training 25.3 min), online 50.7 min: offline is faster" in text
    )
    assert "116.83B parameters, 114.66B of them MoE expert weights" in text
    assert "MXFP4 65.2 GB, bf16 233.7 GB" in text and "8.2 GB / 29.2 GB per GPU (fits / fits" in text
    assert "capture: 23,045 bytes/token (same, teacher final) = 4.46 TB" in text
    assert "draft: 215.5M trainable, 671.3M frozen (the target's embedding and lm_head rows)" in text
    hf_text = render(load_recipe("gpt-oss-120b", ["data.backend=hf", "capture.backend=hf"]), hf)
    assert "target replicas: 8 of 1 GPU(s) each (MXFP4" in hf_text


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("lm_head", ["random", "target_frozen"])
def test_training_memory_prices_the_optimizer_and_a_frozen_lm_head(optimizer, lm_head):
    """Static training bytes = fp32 weights and gradients of the trainable parameters + the optimizer's state
    (AdamW: 2 moments; Muon: 1 momentum on the hidden matrices, AdamW's 2 on the norms) + the fp32 frozen
    weights (the embedding; the lm_head under target_frozen) + the fp32 teacher lm_head and its bf16 copy."""
    over = [f"train.optimizer={optimizer}", f"draft.lm_head={lm_head}"]
    p = plan(load_recipe("gpt-oss-120b", over), "8xH100")
    norms, head = 7 * H, H * VD
    trainable = MATRICES + norms + (head if lm_head == "random" else 0)
    state = 8 * trainable if optimizer == "adamw" else 4 * MATRICES + 8 * (trainable - MATRICES)
    frozen = V * H + (head if lm_head == "target_frozen" else 0)
    assert (p.draft_trainable, p.draft_frozen) == (trainable, frozen)
    assert p.train_static_gb * 1e9 == pytest.approx(8 * trainable + state + 4 * frozen + 6 * V * H)
    assert p.allreduce_bytes == 4 * trainable
    assert f"gradients, {'AdamW' if optimizer == 'adamw' else 'Muon (AdamW on the rest)'}, frozen" in render(
        load_recipe("gpt-oss-120b", over), p
    )


def test_long_context_plan_scales_activations_and_training_rate():
    r = load_recipe("gpt-oss-120b-long-context", ["train.sequence_parallel=1"])
    p = plan(r, "8xH200")
    a = Assumptions()
    assert r.train.checkpoint_layer and r.train.max_length == 131072
    act = a.act_bytes_per_token_step_checkpointed * 131072 * r.train.batch_size * r.train.ttt_steps
    assert p.train_activation_gb * 1e9 == pytest.approx(act + p.train_teacher_gb * 1e9)
    assert p.train_tok_s == pytest.approx(8 * 15.8e3 * 7 / r.train.ttt_steps)  # held at the 32K rate
    # each row over 4 GPUs (train.sequence_parallel): a GPU holds a quarter of its tokens' activations
    r4 = load_recipe("gpt-oss-120b-long-context", ["train.sequence_parallel=4"])
    sp = plan(r4, "8xH200")
    assert sp.train_activation_gb == pytest.approx(p.train_activation_gb / 4)
    assert sp.train_static_gb == pytest.approx(p.train_static_gb)
    assert "max_length 131072 / 4 GPUs (train.sequence_parallel) x batch 1" in render(r4, sp)
    assert load_recipe("gpt-oss-120b-long-context").train.sequence_parallel == 2  # 128K rows: 64K per GPU
    with pytest.raises(ValueError, match=r"^train.sequence_parallel=3 must divide the draft's attention"):
        plan(load_recipe("gpt-oss-120b-long-context", ["train.sequence_parallel=3"]), "8xH200")


def test_eval_memory_of_the_long_context_recipe_matches_hand_computation():
    """eyas/plan/eval_memory.py on recipes/gpt-oss-120b-long-context.yaml (bf16, 16 requests of 128K tokens,
    prefill chunks of 8,192, 1 GiB attention blocks), against gpt-oss-120b's dimensions by hand, and the line
    `eyas plan` prints with it."""
    from eyas.plan.cost import count_draft, target_config
    from eyas.plan.eval_memory import eval_memory

    r = load_recipe("gpt-oss-120b-long-context")
    cfg, _ = target_config(r)
    m = eval_memory(r, cfg, count_draft(r, cfg).config, 0.0, 2)
    k = r.eval.k
    per_slot = (36 * 2 * 8 * 64 + 1 * 2 * 8 * 64) * 2  # the target's 36 layers and the draft's one, KV heads
    assert (m.rows, m.context) == (16, 131072)
    assert m.kv == m.kv_growth == 16 * (131072 + 2 * (k + 1) + k) * per_slot
    H, I = 2880, 2880
    layer = (6 * H + (64 * 2 + 2 * 8) * 64 + 4 * (4 * H + 8 * I)) * 2  # top-4 experts' grouped_mm rows
    per_token = layer + 3 * H * 2 + (8 * H + 3 * 17280) * 2  # + the aux states, the draft's layer
    logits = 16 * (201088 * (2 + 4) + 32000 * 4)
    assert m.activations == 4 * 8192 * 131072 + (1024 << 20) + 8192 * per_token + logits
    p = plan(r, "8xH100")
    e = p.eval_memory
    assert (e.kv, e.activations) == (m.kv, m.activations) and p.process_bytes["eval"] == e.total
    assert f"eval (eyas's loop): {e.total / 1e9:,.1f} GB = weights {e.weights / 1e9:,.1f} GB" in render(r, p)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("8xH100", (8, "H100")),
        ("4xA100 80GB", (4, "A100")),
        ("H200", (1, "H200")),
        ("2xB200", (2, "B200")),
        ("cpu", (1, "CPU")),
    ],
)
def test_gpu_spec(text, expected):
    assert parse_gpus(text) == expected


def test_unknown_gpu_names_the_choices():
    with pytest.raises(
        ValueError, match=r"--gpus '8xV100': expected NxGPU with GPU one of H100, H200, B200, A100 .*, or cpu"
    ):
        parse_gpus("8xV100")


def test_gpt_oss_120b_plan_from_a_prompts_stage_run_offline(tmp_path):
    """What the plan tells a user to do before renting GPUs, with nothing of gpt-oss-120b on the machine and
    no hub: `eyas prompts` needs no target, and `eyas plan --run` counts its turns, says that the prompts
    could not be rendered without the tokenizer and which files to fetch for that, and plans the rest."""
    import os
    import subprocess
    import sys

    from data_fixtures import TURNS, prompt_lengths_by_characters, write_conversations

    from eyas.infra.io import read_jsonl

    convs = write_conversations(tmp_path / "conversations.jsonl")
    over = [f"data.prompts={convs}", "data.num_prompts=null", "data.num_eval_prompts=2"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}  # an empty cache
    eyas = [sys.executable, "-m", "eyas"]
    out = subprocess.run(
        [*eyas, "prompts", "gpt-oss-120b", "--out", str(tmp_path / "run"), *over],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "prompts: 6 train (18 user turns, at most 3 per prompt)" in out.stdout
    out = subprocess.run(
        [*eyas, "plan", "gpt-oss-120b", "--gpus", "8xH100", "--run", str(tmp_path / "run"), *over],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    a = Assumptions()
    kept = a.kept_answer_fraction_harmony * a.new_token_fraction * 2048
    lengths = prompt_lengths_by_characters(read_jsonl(tmp_path / "run" / "prompts" / "train.jsonl"), kept)
    mean = sum(lengths) / len(lengths) + a.new_token_fraction * 2048
    assert (
        f"data: 6 conversations x 3.00 answered turns = {6 * TURNS} sequences x {mean:,.0f} tokens"
        in out.stdout
    )
    assert "the tokenizer of openai/gpt-oss-120b could not be used" in out.stdout
    assert (
        "`hf download openai/gpt-oss-120b tokenizer.json tokenizer_config.json special_tokens_map.json "
        "chat_template.jinja`" in out.stdout
    )
    assert (
        "target openai/gpt-oss-120b (eyas's built-in copy of its hub config): 116.83B parameters"
        in out.stdout
    )


def test_the_teacher_scratch_is_one_chunk_of_the_positions_there_are():
    """teacher_scratch_bytes (eyas/plan/cost.py): target_view's chunk is at most the step's positions; with
    every id the draft's (DFlash), 8 V + 8 V_d bytes a position; the lm_head's bf16 copy, kept through
    training unless it is fp32 (teacher_cast_bytes); a top-k teacher renormalises a copy of its probabilities
    instead."""
    from eyas.plan.cost import count_draft, target_config, teacher_cast_bytes, teacher_scratch_bytes

    r = load_recipe("gpt-oss-120b-dflash", ["train.max_length=512"])
    d = count_draft(r, target_config(r)[0])
    assert d.config.draft_vocab_size == V
    assert teacher_scratch_bytes(r, d, 100) == 100 * 16 * V
    assert teacher_scratch_bytes(r, d, 512) == 128 * 16 * V and teacher_cast_bytes(r, d) == 2 * V * H
    fp32 = load_recipe("gpt-oss-120b-dflash", ["train.mixed_precision='no'"])
    assert teacher_scratch_bytes(fp32, d, 8192) == 128 * 16 * V and teacher_cast_bytes(fp32, d) == 0
    topk = load_recipe("gpt-oss-120b", ["capture.teacher=topk"])
    assert teacher_scratch_bytes(topk, count_draft(topk, target_config(topk)[0]), 4096) == 4096 * 4 * VD


def test_the_loss_scratch_is_one_chunk_of_the_fused_loss():
    """loss_scratch_bytes (eyas/plan/cost.py): LOSS_CHUNK_BYTES a logit (kl: four fp32 copies) of one chunk
    over the draft vocabulary, the chunk train/loss.py's BUDGET (2^26 logits: 2,097 positions at 32,000 ids,
    8,192 at 8,192), or the step's positions where fewer; the batch's rows share it."""
    from eyas.plan.cost import count_draft, loss_scratch_bytes, target_config

    r = load_recipe("gpt-oss-120b", [])
    d = count_draft(r, target_config(r)[0])
    assert loss_scratch_bytes(r, d, 1000) == 16 * 1000 * VD
    assert loss_scratch_bytes(r, d, 4096) == 16 * 2097 * VD  # one chunk of 2^26 // 32,000 positions
    b4 = load_recipe("gpt-oss-120b", ["train.batch_size=4"])
    assert loss_scratch_bytes(b4, d, 4 * 4096) == 16 * 4 * 524 * VD  # (4, 524) positions a chunk
    # the SmolLM2 long recipe's draft vocabulary and rows: measured 4 x 268 MB live at a step's peak
    v8k = load_recipe("gpt-oss-120b", ["vocab.draft_vocab_size=8192"])
    assert loss_scratch_bytes(v8k, count_draft(v8k, target_config(v8k)[0]), 8192) == 16 * 8192 * 8192


class LiveBytes:
    """Counts the bytes of the tensors a block of torch ops makes and holds (a dispatch mode: each output's
    storage from its creation until its last reference dies), those in `skip` (the inputs) apart: `peak`."""

    def __init__(self, skip):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in out if isinstance(out, (tuple, list)) else [out]:
                    if isinstance(t, torch.Tensor):
                        counter.made(t)
                return out

        self.mode, self.skip, self.refs, self.live, self.peak = Mode(), skip, {}, 0, 0

    def made(self, t):
        import weakref

        key, n = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        if key in self.skip:
            return
        if key not in self.refs:
            self.refs[key], self.live = 0, self.live + n
            self.peak = max(self.peak, self.live)
        self.refs[key] += 1
        weakref.finalize(t, self.drop, key, n)

    def drop(self, key, n):
        self.refs[key] -= 1
        if not self.refs[key]:
            del self.refs[key]
            self.live -= n

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def storages(*tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


@pytest.mark.parametrize("kind", ["kl", "ce", "lk"])
def test_the_fused_loss_holds_what_the_plan_prices_a_chunk(kind):
    """The fused loss (train/loss.py linear_loss) at its peak holds LOSS_CHUNK_BYTES a logit of one chunk
    (eyas/plan/cost.py loss_scratch_bytes), however many chunks it runs (each freed before the next), and
    at most 1.5 bytes a logit more (dW and the cast weight at these small widths): its tensors counted live
    by a dispatch mode, the inputs apart."""
    import torch

    from eyas.plan.cost import LOSS_CHUNK_BYTES
    from eyas.train.loss import chunk_positions, linear_loss

    torch.manual_seed(0)
    H, V, budget = 64, 4096, 1 << 20  # 256 positions a chunk
    for B, L in ((1, 256), (1, 1024), (4, 128)):
        x, W = torch.randn(B, L, H, requires_grad=True), torch.randn(V, H, requires_grad=True)
        p, w = torch.softmax(torch.randn(B, L, V), -1), torch.ones(B, L)
        xn = x * 1.0  # a non-leaf, as the draft's normed states are
        with LiveBytes(storages(xn, W, p, w)) as live:
            linear_loss(xn, W, p, w, kind, budget=budget)
        logits = B * chunk_positions(B, V, budget) * V
        assert 0 <= live.peak / logits - LOSS_CHUNK_BYTES[kind] <= 1.5, (B, L, live.peak / logits)


@pytest.mark.parametrize("H, V", [(64, 4096), (1024, 1024)])
@pytest.mark.parametrize("kind", ["peagle", "dflash"])
def test_a_loss_over_kept_anchors_holds_what_the_plan_prices(kind, H, V):
    """P-EAGLE's depths past 0 and DFlash's drafts run the loss over their kept anchors alone (train/ttt.py
    step_loss with `rows`): the anchors' teacher probabilities and states gathered into one row, then the
    fused loss over it. Counted live (the inputs apart) at a grid of 2 x 512 positions, 96 anchors (the
    recipe's share of them: P-EAGLE's depth 1 at COD's floor 0.09375, above its ratio 0.05; DFlash's 48 blocks
    a row), states of 64 / 1,024 and 4,096 / 1,024 ids: within 3% of gathered_loss_bytes (eyas/plan/cost.py),
    which loss_scratch_bytes takes where it exceeds an in-place chunk over every position (P-EAGLE's depth
    0; DFlash has none). Measured at (64, 4,096): 20.3 bytes an anchor's logit, priced 20.2; without the
    gathered copy the plan would price 16 (and at (1,024, 1,024), 16 of 36)."""
    from types import SimpleNamespace

    import torch

    from eyas.plan import cost
    from eyas.train.ttt import step_loss

    torch.manual_seed(0)
    B, T = 2, 512
    # the lm_head frozen (draft.lm_head target_frozen, the gpt-oss recipes'): a trained one adds its (V_d, H)
    # gradient at each loss call (train/loss.py), which the plan does not price
    draft = SimpleNamespace(
        norm=torch.nn.RMSNorm(H), lm_head=torch.nn.Linear(H, V, bias=False).requires_grad_(False)
    )
    over = {"peagle": ["train.cod_ratio=0.05", "train.cod_floor=0.09375"], "dflash": ["train.max_anchors=48"]}
    r = load_recipe(f"gpt-oss-120b-{kind}", [f"train.max_length={T}", f"train.batch_size={B}"] + over[kind])
    rows = torch.zeros(B * T, dtype=torch.bool)
    rows[torch.randperm(B * T)[:96]] = True
    hidden = torch.randn(B, T, H, requires_grad=True)
    probs, w = torch.softmax(torch.randn(B, T, V), -1), torch.ones(B, T, dtype=torch.bool)
    with LiveBytes(storages(hidden, probs, w, draft.lm_head.weight, draft.norm.weight)) as live:
        step_loss(draft, hidden, probs, w, r.train.loss, rows.view(B, T))
    dims = SimpleNamespace(config=SimpleNamespace(draft_vocab_size=V, hidden_size=H))
    priced = cost.gathered_loss_bytes(r, dims, B * T)  # the recipe's share of B * T: 96 anchors
    assert priced == 16 * 96 * V + 96 * (4 * V + 16 * H)
    assert abs(live.peak / priced - 1) < 0.03, (live.peak / (96 * V), priced / (96 * V))
    whole = 16 * B * T * V if kind == "peagle" else 0  # depth 0's chunk in place (kl)
    assert cost.loss_scratch_bytes(r, dims, B * T) == max(whole, priced)
    eagle3 = load_recipe("gpt-oss-120b", [f"train.max_length={T}"])
    assert cost.gathered_loss_bytes(eagle3, dims, B * T) == 0  # its loss runs in place


@pytest.mark.parametrize("recipe", ["gpt-oss-120b", "gpt-oss-120b-peagle", "gpt-oss-120b-dflash"])
def test_a_gpus_plan_prices_a_gathered_loss_beside_the_h100_constant(recipe, monkeypatch):
    """On a GPU the activation constant (H100, EAGLE-3) holds an in-place chunk of the loss and its lm_head
    cast; P-EAGLE's and DFlash's loss over gathered anchors is priced beside it (gathered_loss_bytes and
    the bf16 cast of the draft lm_head: 1.07 GB chunk + 0.44 GB copy + 1.16 GB cast for DFlash's 512
    anchors at 201,088 ids), EAGLE-3's plan unchanged."""
    from eyas.plan import cost

    r = load_recipe(recipe)
    cfg = cost.target_config(r)[0]
    d, a = cost.count_draft(r, cfg), Assumptions()
    act = cost.training_memory(r, cfg, d, a)[1]
    gathered = cost.gathered_loss_bytes(r, d, r.train.max_length * r.train.batch_size)
    monkeypatch.setattr(cost, "gathered_loss_bytes", lambda *args: 0.0)
    without = cost.training_memory(r, cfg, d, a)[1]
    V_d = d.config.draft_vocab_size
    assert act - without == pytest.approx(gathered + (2 * V_d * H if gathered else 0))
    assert (gathered > 0) == (recipe != "gpt-oss-120b")
    if recipe.endswith("dflash"):
        assert gathered == pytest.approx(16 * 333 * V_d + 512 * (4 * V_d + 16 * H))  # 2^26 // 201,088 = 333


@pytest.mark.parametrize("native_bf16", [False, True])
def test_training_memory_on_a_cpu_prices_what_it_computes_in(native_bf16, monkeypatch):
    """On a CPU (eyas/plan/cost.py training_memory, cpu): train.mixed_precision bf16 trains in float32 where
    the CPU has no bf16 arithmetic (no bf16 copy of the teacher lm_head; activations at the CPU's measured
    float32 bytes, 449.4 KB a token-step at these dims against the H100's 217.7 KB in bf16); with it, bf16
    autocast's 0.70 of them and the copy (auto: float32 on any CPU)."""
    from eyas.plan import cost

    monkeypatch.setattr(cost, "cpu_bf16_runs", lambda device, what: native_bf16)
    r = load_recipe("gpt-oss-120b", ["train.max_length=1024", "train.mixed_precision=bf16"])
    cfg = cost.target_config(r)[0]
    d, a = cost.count_draft(r, cfg), Assumptions()
    gpu_static, gpu_act = cost.training_memory(r, cfg, d, a)
    cpu_static, cpu_act = cost.training_memory(r, cfg, d, a, cpu=True)
    teacher = cost.teacher_bytes(d, 1024)
    gpu_unrolled, cpu_unrolled = gpu_act - teacher, cpu_act - teacher  # above the lm_head chunks' scratch
    assert gpu_unrolled == pytest.approx(217.7e3 * 1024 * 5) and gpu_unrolled > cost.teacher_scratch_bytes(
        r, d, 1024
    )
    # on a CPU the kept bytes and the fused loss's chunk beside them (1,024 positions x 32,000 ids x 16 bytes)
    # and under bf16 autocast the draft lm_head's bf16 copy (train/loss.py casts it at each call)
    loss_chunk = 1024 * VD * 16 + (2 * VD * H if native_bf16 else 0)
    assert cpu_unrolled == pytest.approx(449.4e3 * 1024 * 5 * (0.70 if native_bf16 else 1.0) + loss_chunk)
    assert gpu_static - cpu_static == (0 if native_bf16 else 2 * V * H)


def test_capture_memory_of_a_1_5b_target_on_a_cpu_matches_hand_computation():
    """eyas/plan/capture_memory.py for Qwen2.5-Coder-1.5B computing in float32 (the shapes only: no weights),
    8 sequences of up to 704 tokens, 3 aux layers: the first batch's lm_head check (four fp32 copies of 4 x
    128 positions' logits; measured about 1.2 GB) against the longest batch's forward (the decoder layer's
    tensors, the aux states and the previous batch's states: measured about 0.8 + 0.3 GB)."""
    from transformers import Qwen2Config

    from eyas.plan.capture_memory import capture_memory

    cfg = Qwen2Config(
        hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2,
        vocab_size=151936, num_hidden_layers=28,
    )  # fmt: skip
    r = load_recipe("qwen2.5-coder-1.5b")
    assert r.capture.batch_size == 8
    m = capture_memory(r, cfg, 3, 7.1e9, 4, 704, 12_293, 0.12e9)
    assert m.check == 4 * 4 * 128 * 151936 * 4 == 1_244_659_712
    layer = (6 * 1536 + (2 * 12 + 2 * 2) * 128 + 3 * 8960 + 1536) * 4  # residual/norms, q k v o, gate/up/down
    assert m.forward == 8 * 704 * (layer + 10 * 1536 * 4 + 12_293) == 1_343_778_304
    assert m.total == 7.1e9 + 0.12e9 + m.forward
    # before a regeneration, `eyas plan` batches the longest sequence prompts and answers can reach
    demo = load_recipe("demo")
    m = plan(demo, "1xH100").capture_memory
    bound = demo.data.max_prompt_tokens + demo.data.max_new_tokens
    assert (m.rows, m.longest) == (demo.capture.batch_size, bound)


def test_plan_prices_the_prompts_its_sources_hold(smollm2, tmp_path):
    """Before any run, `eyas plan` renders a sample of each of the recipe's sources (the SmolLM2
    long-context recipe's: GSM8K, a ShareGPT sample, long stdlib excerpts and prose from HotpotQA, SQuAD and
    WritingBench) and mixes them by weight: its sequences and mean prompt within 10% of what it counts from
    that stage's own output (--run), and far from the 400 tokens it assumes where it can read no source. Each
    source counts at its weight whatever its size; a hub dataset it cannot stream (offline) is priced at the
    assumption, and the plan names it."""
    from eyas.data.prompts import run_prompts

    recipe = load_recipe("smollm2-135m-long-context")
    sampled = plan(recipe, "1xH100")
    run_prompts(recipe, tmp_path / "run", progress=False)
    counted = plan(recipe, "1xH100", run_dir=tmp_path / "run")
    assert sampled.turns.origin == "a sample of each source, mixed by weight"
    assert sampled.turns.rendered > 1900
    assert sampled.turns.mean_prompt == pytest.approx(counted.turns.mean_prompt, rel=0.1)
    assert sampled.sequences == pytest.approx(counted.sequences, rel=0.1)

    def alone(source):
        return plan(load_recipe("smollm2-135m-long-context", [f"data.prompts={source}"]), "1xH100").turns

    stdlib, gsm8k = alone("stdlib-long-8k"), alone("data/sets/gsm8k_train.jsonl")
    assert stdlib.mean_prompt > 4 * Assumptions().mean_prompt_tokens  # 1,896 tokens
    both = "data.prompts=[{source: data/sets/gsm8k_train.jsonl}, {source: stdlib-long-8k}]"
    mixed = plan(load_recipe("smollm2-135m-long-context", [both]), "1xH100").turns
    t_g, t_s = gsm8k.turns_per_conversation, stdlib.turns_per_conversation
    assert mixed.turns_per_conversation == pytest.approx((t_g + t_s) / 2)
    mean = (t_g * gsm8k.mean_prompt + t_s * stdlib.mean_prompt) / (t_g + t_s)  # per answered turn
    assert mixed.mean_prompt == pytest.approx(mean)
    hub = (
        "data.prompts=[{source: data/sets/gsm8k_train.jsonl}, "
        "{source: HuggingFaceH4/ultrachat_200k, split: train_sft}]"
    )
    half_hub = load_recipe("smollm2-135m-long-context", [hub])
    p = plan(half_hub, "1xH100")  # the suite runs offline (HF_HUB_OFFLINE, tests/conftest.py)
    assert p.turns.mean_prompt == pytest.approx((t_g * gsm8k.mean_prompt + 400) / (t_g + 1))
    assert (
        "priced at the assumed 400-token prompt, one turn each: HuggingFaceH4/ultrachat_200k (50% of the "
        "prompts: data.prompts[1].source=HuggingFaceH4/ultrachat_200k: the dataset is not in the Hugging "
        "Face cache and HF_HUB_OFFLINE is set" in render(half_hub, p)
    )


def test_plan_streams_a_sample_of_a_hub_dataset(smollm2, tmp_path, monkeypatch):
    """A hub source is priced from HUB_SAMPLED records streamed by `datasets` (not from the assumed 400
    tokens): the same records read whole from a local file price the same. No network here: the hub's
    lookup of acme/long-prompts is replaced by the same records in a local JSON-lines file, streamed and
    shuffled by `datasets` as the hub's files would be."""
    import json

    import datasets

    from eyas.plan.tokens import HUB_SAMPLED

    words = [" ".join(["the essay goes on"] * (100 + 4 * (i % 100))) for i in range(2 * HUB_SAMPLED)]
    records = [
        json.dumps({"messages": [{"role": "user", "content": f"{i}: {w}"}]}) for i, w in enumerate(words)
    ]
    (tmp_path / "all.jsonl").write_text("\n".join(records) + "\n")
    load, asked = datasets.load_dataset, []

    def hub(name, config=None, split=None, streaming=False):
        asked.append((name, config, split, streaming))
        return load("json", data_files=str(tmp_path / "all.jsonl"), split="train", streaming=True)

    monkeypatch.setattr(datasets, "load_dataset", hub)
    recipe = load_recipe("smollm2-135m-long-context", ["data.prompts=acme/long-prompts"])
    streamed = plan(recipe, "1xH100").turns
    assert asked == [("acme/long-prompts", None, "train", True)]
    assert streamed.origin == (
        f"a sample of each source, mixed by weight (acme/long-prompts: {HUB_SAMPLED} records sampled from "
        f"the hub (about {2 * HUB_SAMPLED} streamed))"
    )
    assert streamed.unread == "" and streamed.rendered == HUB_SAMPLED
    assert streamed.mean_prompt > 1000  # 400-1,984 words, not the 400 tokens assumed
    monkeypatch.chdir(tmp_path)
    whole = plan(load_recipe("smollm2-135m-long-context", ["data.prompts=all.jsonl"]), "1xH100").turns
    # 200 of the 400 (lengths repeat every 100 records: the streamed window prices as the whole would)
    assert streamed.mean_prompt == pytest.approx(whole.mean_prompt, rel=0.05)


def test_capture_flops_count_the_padded_batches_the_causal_window_and_the_shards():
    """eyas/plan/flops.py: through transformers, batches sorted by length and padded to their longest, every
    pair of the padded T x T (an unpadded batch: causal); through vLLM each sequence alone, its causal pairs
    within the window; shards of about equal tokens, and a run's rate recovered from its summed tokens/s."""
    from eyas.plan.flops import ForwardCost, capture_work, causal_pairs, measured_flop_s
    from eyas.plan.tokens import spread

    hf = ForwardCost(linear=10.0, widths=[8, 8], windows=[None, 4], batch_size=2, padded=True)
    # sorted 1, 2 | 3, 10 | 11: rows run 2 + 2 + 10 + 10 + 11 = 35 tokens; padded pairs 4 + 4 + 100 + 100;
    # 11 alone is unpadded: causal, 66 pairs full and 1 + 2 + 3 + 4 x 8 = 38 in the window of 4
    w = capture_work(hf, [11, 3, 1, 10, 2])
    assert (w.tokens, w.run_tokens) == (27, 35)
    assert w.attention == 4 * 16 * 208 + 4 * 8 * (66 + 38)
    assert w.flops == 10 * 35 + w.attention
    # alone, causal: 10 tokens see 55 pairs; in a window of 4: 1 + 2 + 3 + 4 + 6 x 4 = 34
    assert causal_pairs(10.0, None) == 55 and causal_pairs(10.0, 4) == 34
    vllm = ForwardCost(linear=10.0, widths=[8, 8], windows=[None, 4], batch_size=2, padded=False)
    w = capture_work(vllm, [10])
    assert (w.run_tokens, w.attention) == (10, 4 * 8 * 55 + 4 * 8 * 34)
    # two shards of about equal tokens: the batches (1, 2), (3, 10) | (11): the second holds the 11 alone
    w = capture_work(hf, [11, 3, 1, 10, 2], shards=2)
    assert w.shard_tokens == [16, 11] and sum(w.shard_flops) == pytest.approx(w.flops)
    # each shard at R FLOP/s: the stage's tokens/s is the shards' summed, from which R comes back
    rate = 1e6
    summed = sum(t / (f / rate) for t, f in zip(w.shard_tokens, w.shard_flops))
    assert measured_flop_s(w, summed) == pytest.approx(rate)
    # a small run's lengths spread over a bigger run's count keep their mean and their ends
    sample = [100, 200, 400, 800, 6000]
    spread_out = spread(sample, 1000, 1500.0)
    assert len(spread_out) == 1000 and spread_out.mean() == pytest.approx(1500.0)
    assert 100 <= spread_out.min() < 101 and 5999 < spread_out.max() <= 6000


def test_training_flops_count_the_draft_steps_the_teacher_and_the_pairs_within_a_sequence():
    """eyas/plan/train_work.py at gpt-oss-120b's recipe: 6 FLOPs a weight a step (the embedding a lookup),
    the teacher's lm_head forward, 12 x heads x head_dim a causal pair a step; sequences cut to max_length."""
    from eyas.plan.command import plan
    from eyas.plan.cost import count_draft, target_config, unrolled_steps
    from eyas.plan.train_work import causal_pairs_per_token, train_cost

    r = load_recipe("gpt-oss-120b")
    cfg = target_config(r)[0]
    draft = count_draft(r, cfg)
    cost = train_cost(r, draft, cfg, unrolled_steps(r))
    p = plan(r, "8xH100")
    assert unrolled_steps(r) == 5
    assert cost.per_token == 5 * 6 * (p.draft_trainable + p.draft_frozen - V * H) + 2 * V * H
    dc = draft.config
    assert cost.per_pair == 5 * 12 * dc.num_attention_heads * dc.head_dim * dc.num_layers
    # 4 tokens: 10 pairs; 10 tokens cut to 8: 36 pairs; over 12 tokens
    assert causal_pairs_per_token([4, 10], 8) == pytest.approx(46 / 12)
