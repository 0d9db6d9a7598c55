"""Fixtures for tests that drive the real huggingface_hub client against the local hub."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def no_agent_registry_fetch():
    """huggingface_hub 2.4 fetches {HF_ENDPOINT}/api/agent-harnesses once per process for its user
    agent (huggingface.co here, where HF_ENDPOINT was not set at import): give it the empty registry."""
    from huggingface_hub.utils import _detect_agent

    saved = getattr(_detect_agent, "_registry", None)
    _detect_agent._registry = {"standardEnvVars": [], "harnesses": {}}
    yield
    _detect_agent._registry = saved
