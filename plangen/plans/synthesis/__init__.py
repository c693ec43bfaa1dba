"""The synthesizer: a plan for any decoder from its modules, where no hand-written plan exists.

:mod:`~plangen.plans.synthesis.analysis` walks the model (the embedding, the head, the decoder
layers and every child of them, what lies outside) and asks the block families
(:mod:`plangen.plans.families`) what each child is, collecting what can be sharded and what stays
whole, and why (``findings``); :mod:`~plangen.plans.synthesis.synthesize` turns that into plan
entries at every layer, generalized to patterns. Beside them: blocks split across children
(``analysis_split``), lists of blocks beside the layers (``block_stacks``), per-head and per-layer
inputs (``per_head_inputs``, ``per_layer_inputs``) and vision or audio towers (``towers``).
"""
