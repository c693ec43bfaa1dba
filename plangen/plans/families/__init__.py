"""Block families: what a child of a decoder layer is, and the plan entries that shard it.

A family module holds what recognizes its blocks (by their modules, shapes and forward source) and
the entries of its blocks' plans, so that a block knows its own entries: attention, MLP and mixture
of experts (``core``, with what a recognized block is: ``ShardedBlock``, ``KeptBlock``), latent
attention (``latent``), Mamba1 and Mamba2 mixers (``mamba1``, ``mamba2``), gated delta nets
(``linear_attention``), multi-head recurrent mixers (``recurrent``), ProphetNet's bucketed attention
(``bucketed_attention``), experts called by the layer itself (``layer_experts``), packed and
wrapped attention (``packed``), convolutional attention (``conv_attention``), blocks split across
children (``split``), and the readers of smaller shapes they share (``dims``, ``einsum``, ``gated``,
``moe_parts``, ``short_conv``).

The hand-written plans take their entries from here (DeepSeek's latent attention, NemotronH's and
Zamba2's Mamba2 mixers); the synthesizer (:mod:`plangen.plans.synthesis`) asks every family.
"""
