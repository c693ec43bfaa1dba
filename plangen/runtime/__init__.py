"""The runtime's steps, each one verb, called in order by :mod:`plangen.parallelize` (the public
orchestrator, NeMo RL's API): TP (``tensor_parallel``), compile (``compile``), FSDP2's shard dim and
inputs (``fsdp_shard``, ``fsdp_inputs``), LoRA adapters (``lora``); and what a training loop does with a
parallelized model: gradient norms (``grad_norm``), state dicts and exports in Hugging Face's layout
(``state_dict``, ``export``), NeMo RL's per-model helpers (``nemo_compat``).
"""
