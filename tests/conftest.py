from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))  # tiny_configs, custom_plans

DATA = TESTS / "data"


@pytest.fixture(scope="session")
def fake_pg():
    """A single-process fake process group: TP at any size for shapes and collective counts."""
    import torch.distributed as dist

    from plangen.cost.measure import FAKE_WORLD_SIZE

    # The same group the code under test makes and leaves running (plangen.cost.measure).
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=FAKE_WORLD_SIZE)
    yield
