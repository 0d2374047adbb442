"""The language's two backends over the same model and runner configuration: the
in-process Engine, and HTTP to the suite's shared server."""

from __future__ import annotations

import pytest

from tests.conftest import SMOLLM2_ENGINE


@pytest.fixture(scope="session")
def lang_engine():
    from radixjax import Engine

    with Engine(None, **SMOLLM2_ENGINE) as engine:
        yield engine
        assert engine.stats()["num_late_compiles"] == 0
        engine.check_integrity()


@pytest.fixture(scope="session")
def engine_backend(lang_engine):
    from radixjax.lang import EngineBackend

    return EngineBackend(lang_engine)


@pytest.fixture(scope="session")
def http_backend(server):
    from radixjax.lang import RuntimeEndpoint

    return RuntimeEndpoint(server)


@pytest.fixture(params=["engine", "http"])
def backend(request):
    return request.getfixturevalue(f"{request.param}_backend")
