"""Every draft shape eyas exports for vLLM, derived from one draft so each keeps its acceptance.

    plain           the draft as given (aux ids [a, b, c], one layer)
    norm_before_fc  + input_norm over the concatenated aux states, its weight the states' mean RMS
                    over `sample` (so RMSNorm(x) * w ~ x where the draft was trained)
    aux_id_N        the last aux id replaced by N (the last layer's output before the final norm)
    n_aux_4         ids + [N]: fc's extra block small (std 1e-3 / sqrt(H)), the rest as trained
    num_layers_2    + a plain Llama layer `layers.1` whose o_proj / down_proj are small: near identity
    norm_output     the same weights, each chained step fed the final norm's output instead of the prenorm
                    one (speculators 0.9's default; changes every position after the first)
    sliding_window  the same weights attending over the last 16 positions (draft.sliding_window)

Each is a real, different draft (no option collapses to the plain one), and each still proposes
what the trained draft proposes most of the time, so per-position acceptance at k >= 3 is far
from 0 and a disagreement between two engines would show.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from eyas.train.model import Eagle3Draft


def _derive(draft: Eagle3Draft, seed: int, **changes) -> Eagle3Draft:
    cfg = dataclasses.replace(copy.deepcopy(draft.config), **changes)
    new = Eagle3Draft(cfg).to(draft.fc.weight.dtype)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in new.named_parameters():
            p.normal_(0, 1e-3 / p.shape[-1] ** 0.5)
        old = draft.state_dict()
        state = new.state_dict()
        for k, v in state.items():
            if k in old and old[k].shape == v.shape:
                v.copy_(old[k])
    new.load_state_dict(state)
    return new.eval()


def variants(draft: Eagle3Draft, num_target_layers: int, sample_aux: torch.Tensor) -> dict[str, Eagle3Draft]:
    """`sample_aux` (T, n_aux * H_t): the plain draft's aux states on some real tokens."""
    cfg, n = draft.config, num_target_layers
    ids = list(cfg.aux_layer_ids)
    out = {"plain": draft}

    nbf = _derive(draft, 1, norm_before_fc=True)
    with torch.no_grad():
        nbf.input_norm.weight.fill_(float(sample_aux.float().pow(2).mean().sqrt()))
    out["norm_before_fc"] = nbf

    out["aux_id_N"] = _derive(draft, 2, aux_layer_ids=[*ids[:-1], n])

    wide = _derive(draft, 3, aux_layer_ids=[*ids, n])
    with torch.no_grad():
        h = cfg.target_hidden_size
        wide.fc.weight[:, : len(ids) * h].copy_(draft.fc.weight)
    out["n_aux_4"] = wide

    deep = _derive(draft, 4, num_layers=2)
    with torch.no_grad():
        later = deep.layers["1"]
        for norm in (later.input_layernorm, later.post_attention_layernorm):
            norm.weight.fill_(1.0)
        for lin in (later.self_attn.q_proj, later.self_attn.k_proj, later.self_attn.v_proj):
            lin.weight.normal_(0, 1 / lin.weight.shape[1] ** 0.5)
        for lin in (later.mlp.gate_proj, later.mlp.up_proj):
            lin.weight.normal_(0, 1 / lin.weight.shape[1] ** 0.5)
    out["num_layers_2"] = deep
    out["norm_output"] = _derive(draft, 5, norm_output=True)
    # the same weights attending over the last 16 positions only (prompts here run 30-100 tokens, answers 48)
    out["sliding_window"] = _derive(draft, 6, sliding_window=16)
    return out
