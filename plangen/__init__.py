"""plangen: generate, verify and apply FSDP2 + tensor-parallel plans for Hugging Face causal LMs.

Data flows one way through stages, each a package here, and a module imports only from its own
stage or a lower one (``tests/test_architecture.py`` holds the order):

- :mod:`plangen.output` (one-line errors, files written safely) and :mod:`plangen.stack` (the
  torch and transformers releases, their differences behind one module each) at the bottom;
- :mod:`plangen.model`: a name becomes a config and a meta model; its module tree, heads, tiny versions;
- :mod:`plangen.plan`: a plan as data, and the torch-free words and table its styles are described in;
- :mod:`plangen.distributed`: launching ranks, a fake process group, counting collectives;
- :mod:`plangen.styles`: the parallel styles, one module per mechanism;
- :mod:`plangen.plans`: which plan a model gets (custom, hand-written, synthesized, Hugging Face's)
  and how each is made;
- :mod:`plangen.runtime`, orchestrated by :mod:`plangen.parallelize` (NeMo RL's API): TP, activation
  checkpointing, compile, FSDP2, and what training does with the result; :mod:`plangen.loss`:
  losses on vocabulary-parallel logits;
- :mod:`plangen.check` (``plangen verify``) and :mod:`plangen.cost` (``plangen cost``);
- :mod:`plangen.commands`: the CLI (parses, calls one core function, prints, exits) and the cores of
  ``init``, ``prove`` and ``list``. Nothing imports the CLI.

Importing the package is cheap on purpose (the CLI must answer ``--help`` fast): torch and
transformers are imported by the submodules that need them.
"""

__version__ = "0.1.0"
