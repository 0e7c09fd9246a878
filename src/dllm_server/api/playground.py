"""The web playground: a page (static files shipped in the package, no build step, nothing fetched
from elsewhere) that sends a request with `stream_options.include_progress` and draws the canvas
being denoised. `/playground/info` tells the page what it cannot know by itself (whether a key
is needed, the server's defaults, which ids end an answer). The page and its files are open like
/health: the API key is typed into the page and sent by it as the bearer header."""
from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ..decoding.params import SamplingParams
from ..engine.async_engine import AsyncEngine
from ..request.output import MASK_GLYPH

STATIC = Path(__file__).resolve().parents[1] / "assets" / "playground"
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# Everything from this origin only: the page never loads or sends anything elsewhere.
HEADERS = {"Content-Security-Policy": "default-src 'self'; style-src 'self'; "
                                      "script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


class Playground:
    def __init__(self, engine: AsyncEngine, model_name: str):
        self.engine = engine
        self.model_name = model_name
        # The shipped files, listed once: a request names one of them or gets a 404 (no paths).
        self.files = {p.name: p for p in STATIC.iterdir() if p.suffix in MEDIA_TYPES}

    def routes(self) -> list[Route]:
        return [Route("/", self.root, methods=["GET"]),
                Route("/playground", self.page, methods=["GET"]),
                Route("/playground/info", self.info, methods=["GET"]),
                Route("/playground/{name}", self.asset, methods=["GET"])]

    async def root(self, request: Request) -> Response:
        return RedirectResponse("/playground", status_code=307)

    async def page(self, request: Request) -> Response:
        return self._file("index.html")

    async def asset(self, request: Request) -> Response:
        return self._file(request.path_params["name"])

    def _file(self, name: str) -> Response:
        path = self.files.get(name)
        if path is None:
            return JSONResponse({"error": {"message": "not found", "type": "NotFoundError", "param": None,
                                           "code": 404}}, status_code=404)
        return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=HEADERS)

    async def info(self, request: Request) -> Response:
        cfg, eng = self.engine.config, self.engine
        sampling = SamplingParams(**eng.sampling_defaults)       # the generation config's, if any
        model_block = eng.model_info.block_size if eng.is_ready else 0   # block-causal: the model's own
        return JSONResponse({
            "model": self.model_name,
            "ready": eng.is_ready,
            "auth_required": cfg.api_key is not None,
            "mask_glyph": MASK_GLYPH,
            "stop_token_ids": list(eng.stop_ids),
            "max_model_len": eng.model_info.max_len if eng.is_ready else None,
            "threshold_policy": cfg.threshold_policy,       # slo: a request's slo_ms steers its thresholds
            "default_slo_ms": cfg.default_slo_ms,
            "defaults": {"chat_max_tokens": eng.sampling_defaults.get("max_tokens", cfg.default_chat_max_tokens),
                         "completion_max_tokens": eng.sampling_defaults.get("max_tokens",
                                                                            cfg.default_completion_max_tokens),
                         "block_length": model_block or cfg.block_length, "threshold": cfg.threshold,
                         "temperature": sampling.temperature},
        }, headers={"Cache-Control": "no-store"})
