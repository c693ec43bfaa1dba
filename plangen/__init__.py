"""plangen: generate, verify and apply FSDP2 + tensor-parallel plans for Hugging Face causal LMs.

Importing the package is cheap on purpose (the CLI must answer ``--help`` fast): torch and
transformers are imported by the submodules that need them.
"""

__version__ = "0.1.0"
