"""vLLM as a real component: found or installed in its own venv (vllm_env.py), run as a server
(vllm_server.py) or offline over several draft configurations in one process (vllm_jobs.py ->
vllm_offline.py, which runs under vLLM's Python and imports nothing of eyas)."""
