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

    def _regroups(self):
        if self.engine.dead:
            raise APIError(500, f"engine is dead: {self.engine.dead}")
        if not self.engine.is_ready or self.engine.regroups is None:
            raise APIError(503, "engine is starting", headers={"Retry-After": "2"})
        return self.engine.regroups

    async def status(self, request: Request) -> Response:
        driver = self._regroups().driver
        rg = driver.active
        active = None if rg is None else {"from": rg.current.degrees(), "to": rg.target.degrees(),
                                          "why": driver.record.why, "wave": rg.wave + 1, "waves": len(rg.waves),
                                          "seconds": round(time.monotonic() - rg.started_at, 3)}
        return JSONResponse({"tensor_parallel_sizes": driver.layout.degrees(), "regroup": active,
                             "regroups_done": len(driver.records)})

    async def reconfigure(self, request: Request) -> Response:
        regroups = self._regroups()
        req = parse_body(await read_body(request, self.limits), ReconfigureRequest)
        if self.engine.draining:
            raise APIError(503, "server is shutting down", headers={"Retry-After": "5"})
        try:
            result = await regroups.reconfigure(req.tensor_parallel_sizes, req.timeout_s)
        except ValueError as exc:
            raise APIError(400, str(exc).removeprefix("reconfigure: "), "tensor_parallel_sizes") from None
        except RegroupBusy as exc:
            raise APIError(409, str(exc).removeprefix("reconfigure: ")) from None
        except TimeoutError as exc:
            raise APIError(504, str(exc).removeprefix("reconfigure: ")) from None
        except RegroupAborted as exc:
            raise APIError(503, str(exc).removeprefix("reconfigure: ")) from None
        return JSONResponse(result)
