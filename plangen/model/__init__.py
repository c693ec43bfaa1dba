"""What plangen knows about a Hugging Face model before any plan: how a name becomes a model, its
module tree, its heads and config keys, and tiny versions of it for the numerical checks.

Nothing here knows about plans or styles; everything above reads a model through these modules.
"""
