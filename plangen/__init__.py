"""plangen: generate, verify and apply FSDP2 + tensor-parallel plans for Hugging Face causal LMs.

Data flows one way through stages: a model spec becomes a config and a meta model
(:mod:`plangen.models`); a plan is chosen for it as data (:mod:`plangen.plans`: custom, hand-written,
synthesized, Hugging Face's); that plan is rendered to an editable module (:mod:`plangen.init`),
checked (:mod:`plangen.check`), costed (:mod:`plangen.cost`) and applied with the parallel styles
(:mod:`plangen.styles`) by the runtime (:mod:`plangen.parallelize`: TP, activation checkpointing,
compile, FSDP2). Only ``plangen verify --run`` imports the runtime, to run a plan through it; nothing
imports the CLI (:mod:`plangen.cli`: each command parses, calls one core function, prints, exits).

Importing the package is cheap on purpose (the CLI must answer ``--help`` fast): torch and
transformers are imported by the submodules that need them.
"""

__version__ = "0.1.0"
