"""A hidden-states KV connector for vLLM that also runs on a CPU worker (loaded by vLLM, in vLLM's
own Python: stdlib, torch, safetensors and vllm only; never imports eyas).

vLLM 0.32's `extract_hidden_states` speculative method caches the target's hidden states at the
requested layers (`eagle_aux_hidden_state_layer_ids`, vLLM numbering: id k = the input of decoder
layer k; id N = the last layer's output before the final norm) in a KV-cache-like buffer, and its
ExampleHiddenStatesConnector copies them out when a request finishes, to one safetensors file per
request: {"hidden_states": (T, n_layers, H), "token_ids": (T,)}. That copy uses CUDA streams,
events and pinned memory, so on a CPU worker it cannot run. This subclass keeps everything else
(scheduling, file names, the per-file lock a reader waits on) and replaces only the copy: a
synchronous gather from the buffer (`extract_from_kv_cache`) to CPU memory, written before the
request is reported finished. On a GPU it works too (one device-to-host copy per request).

    kv_transfer_config = {"kv_connector": "CpuHiddenStatesConnector",
                          "kv_connector_module_path": "vllm_hidden_states",   # this file's dir on PYTHONPATH
                          "kv_role": "kv_producer",
                          "kv_connector_extra_config": {"shared_storage_path": DIR}}
"""

import fcntl
import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)


class _Done:
    """Stands for the CUDA event the parent class polls: the copy is finished when it is made."""

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets[None, :] + blocks[:, None] * self._block_size).flatten()
        num_tokens = pending.token_ids.shape[0]
        hidden = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), num_tokens)
        tensors = {"hidden_states": hidden.to("cpu").contiguous(), "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            save_file(tensors, pending.filename + ".tmp")
            os.replace(pending.filename + ".tmp", pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases the reader
        self._req_copy_events[pending.req_id] = _Done()
