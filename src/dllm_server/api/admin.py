"""Operator endpoints, served with --admin-endpoints only (behind --api-key like the rest): `GET /reconfigure` shows
the instances' layout and any regroup in progress; `POST /reconfigure {"tensor_parallel_sizes": [2, 1, 1]}` regroups
the devices into instances of those degrees while serving (the planner's own path, by hand) and answers when done."""
from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..engine.async_engine import AsyncEngine
from ..engine.regroups import RegroupAborted, RegroupBusy
from .body import Limits, parse_body, read_body
from .errors import APIError
from .routes import check_serving

# reconfigure()'s refusals and failures, as HTTP statuses
STATUSES = ((ValueError, 400), (RegroupBusy, 409), (TimeoutError, 504), (RegroupAborted, 503))


class ReconfigureRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tensor_parallel_sizes: list[int] = Field(min_length=1, max_length=4096)
    timeout_s: float = Field(120.0, gt=0, le=3600, description="a drain longer than this fails the regroup (504)")


class Admin:
    def __init__(self, engine: AsyncEngine):
        self.engine = engine
        self.limits = Limits.from_config(engine.config)

    def routes(self) -> list[Route]:
        return [Route("/reconfigure", self.status, methods=["GET"]),
                Route("/reconfigure", self.reconfigure, methods=["POST"])]

    async def status(self, request: Request) -> Response:
        check_serving(self.engine, draining_ok=True)
        driver = self.engine.regroups.driver
        rg = driver.active
        active = None if rg is None else {"from": rg.current.degrees(), "to": rg.target.degrees(),
                                          "why": driver.record.why, "wave": rg.wave + 1, "waves": len(rg.waves),
                                          "seconds": round(time.monotonic() - rg.started_at, 3)}
        return JSONResponse({"tensor_parallel_sizes": driver.layout.degrees(), "regroup": active,
                             "regroups_done": len(driver.records)})

    async def reconfigure(self, request: Request) -> Response:
        check_serving(self.engine, draining_ok=True)
        req = parse_body(await read_body(request, self.limits), ReconfigureRequest)
        check_serving(self.engine)
        try:
            result = await self.engine.regroups.reconfigure(req.tensor_parallel_sizes, req.timeout_s)
        except tuple(t for t, _ in STATUSES) as exc:
            status = next(s for t, s in STATUSES if isinstance(exc, t))
            raise APIError(status, str(exc).removeprefix("reconfigure: "),
                           "tensor_parallel_sizes" if status == 400 else None) from None
        return JSONResponse(result)
