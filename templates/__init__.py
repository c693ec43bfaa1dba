"""plangen's jinja2 templates (``plan.py.j2``), shipped in the wheel as ``plangen.templates``."""
