"""What each KServe v2 operation does with the server, whichever wire carried it.

HTTP (`kserve_http`) and gRPC (`grpc/service.py`) only decode and encode; between the two they
call one method here. So an infer request finds its model (aliases included), is built and
checked (`kserve.infer_request`), kept within the item limit and answered by the same code on
both, and readiness and statistics cannot disagree between them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from queryserve.config import ModelConfig
from queryserve.errors import InvalidInput, NotFound, QueryServeError
from queryserve.repository import VERSION
from queryserve.scheduling.stats import ModelStats
from queryserve.server import kserve
from queryserve.server.state import ServerState

Decoder = Callable[[ModelConfig, int], kserve.InferRequest]
"""A codec's decoding of the request it holds, against the config of the model it names and
the server's item limit (checked on the shape, before a tensor's data is decoded)."""


class KServeService:
    """The KServe v2 operations over the server's state."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def infer(self, name: str, version: str | None,
                    decode: Decoder) -> kserve.InferAnswer:
        model = self.state.model(name, version)
        try:  # `ServerState.reading`, inline: the hot path of every KServe request
            request = decode(model.config, self.state.limits.max_items)
            inputs = kserve.model_inputs(request, model.config)
        except QueryServeError as exc:
            model.stats.record_request(exc.outcome, 0.0)
            raise
        result = await self.state.infer(model, inputs)
        return kserve.InferAnswer.of(model.config, request, model.tensors(result))

    def ready(self) -> bool:
        return self.state.ready()

    def model_ready(self, name: str, version: str | None) -> bool:
        """Whether the model is loaded and ready at that version; an unknown model is a 404,
        a known one not loaded (or at another version) is just not ready."""
        model = self.state.repository.models.get(self.state.resolve(name))
        return model is not None and version in (None, "", VERSION) and model.ready()

    def model_ready_or_not(self, name: str, version: str | None) -> bool:
        """`model_ready`, with an unknown or unnameable model not ready rather than an error:
        Triton's gRPC `ModelReady` answers so, and tritonclient's `is_model_ready` polls it."""
        try:
            return self.model_ready(name, version)
        except (NotFound, InvalidInput):
            return False

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """The repository's models and their states (`ready`: only those ready)."""
        entries = self.state.repository.index()
        return [e for e in entries if e["state"] == "READY"] if ready_only else entries

    async def load(self, name: str, parameters: dict[str, Any]) -> None:
        _check_parameters(parameters, "load")
        await self.state.load(name)

    async def unload(self, name: str, parameters: dict[str, Any]) -> None:
        _check_parameters(parameters, "unload")
        await self.state.unload(name)

    def metadata(self, name: str, version: str | None) -> dict[str, object]:
        return kserve.model_metadata(self.state.model(name, version).config, VERSION)

    def config(self, name: str, version: str | None) -> dict[str, object]:
        model = self.state.model(name, version)
        return kserve.triton_config(model.config, model.threads)

    async def statistics(self, name: str | None = None,
                         version: str | None = None) -> list[dict[str, object]]:
        """Triton's statistics extension (`model_stats`) for one model, or every model when
        `name` is None, from the whole server's snapshot (every worker's); a model loaded a
        moment ago may have no figures yet: its counts are zero."""
        names = None if name is None else [self.state.model(name, version).name]
        snapshot = await self.state.snapshot()
        chosen = sorted(snapshot.models) if names is None else names  # whoever answers
        return [(snapshot.models[n].stats if n in snapshot.models else ModelStats())
                .as_triton_json(n, VERSION) for n in chosen]


def _check_parameters(parameters: dict[str, Any], action: str) -> None:
    """Triton's load takes a config or files to use instead of the repository's, its unload
    `unload_dependents` (tritonclient always sends it, false by default). queryserve serves
    the repository's own files and unloads one model at a time, so it refuses the rest rather
    than ignore them (a client told its config was loaded would be served another)."""
    given = {k for k, v in parameters.items() if not (k == "unload_dependents" and v is False)}
    if given:
        raise InvalidInput(f"{action} parameters ({', '.join(sorted(given))[:200]}) are not "
                           f"supported; queryserve {action}s one model, as the repository "
                           "holds it")
