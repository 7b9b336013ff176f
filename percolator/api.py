"""The HTTP API for saved searches (FastAPI). docs/api.md is the reference.

Every route but /healthz, /docs and /openapi.json needs an API key (`Authorization: Bearer cep_…`
or `X-API-Key`); the key decides the owner, and the owner sees and changes only their own
searches (another owner's id answers 404, exactly as a missing one; creating an id that is taken
answers one and the same 409 whoever holds it). Request bodies are limited in size (413).

  GET    /v1/searches          the caller's searches, a page at a time (?limit=&after=)
  POST   /v1/searches          create {query, id?, metadata?, targets?}        → 201
  GET    /v1/searches/{id}
  PUT    /v1/searches/{id}     change {query?, metadata?, targets?}
  DELETE /v1/searches/{id}                                                      → 204
  POST   /v1/test              {query, event} → does it match, and why

/docs is Swagger UI served from the project's own dependencies (the `swagger-ui-py` package
vendors its files): it works without internet, and its Authorize button takes an API key.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Security
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from cep.errors import QueryError
from percolator.explain import explain
from percolator.model import InvalidSearch, Target
from percolator.registry import LimitExceeded, SearchExists, SearchNotFound, SearchRegistry
from percolator.store import ApiKeyStore

DEFAULT_MAX_BODY = 64 * 1024
# Listing: a page of at most MAX_PAGE searches, DEFAULT_PAGE when `limit` is not given.
DEFAULT_PAGE = 100
MAX_PAGE = 1000
# One answer for any create whose id is taken, whoever holds it (docs/api.md, "Ids").
ID_TAKEN = ("search id {id!r} is not available; choose another id, or leave `id` out to get a "
            "generated one")
# Swagger UI's files, as the `swagger-ui-py` package vendors them (Apache-2.0).
DOCS_ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")
ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


class TargetIn(BaseModel):
    kind: str
    name: str


class SearchIn(BaseModel):
    query: str = Field(max_length=16_384)
    id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    targets: list[TargetIn] = Field(default_factory=list)


class SearchPatch(BaseModel):
    query: str | None = Field(default=None, max_length=16_384)
    metadata: dict[str, Any] | None = None
    targets: list[TargetIn] | None = None


class TestIn(BaseModel):
    query: str = Field(max_length=16_384)
    event: dict[str, Any]


class BodyLimit:
    """Pure ASGI middleware: 413 when a body is (or turns out to be) larger than `limit`."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await _too_large(send, self.limit)
                return
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _BodyTooLarge:
            await _too_large(send, self.limit)


class _BodyTooLarge(Exception):
    pass


async def _too_large(send: Any, limit: int) -> None:
    body = f'{{"detail":"request body larger than {limit} bytes"}}'.encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _query_error(exc: QueryError) -> dict[str, Any]:
    out: dict[str, Any] = {"detail": exc.message, "hint": exc.hint, "rendered": exc.render()}
    if exc.span is not None:
        out.update(line=exc.span.line, col=exc.span.col)
    return out


def _docs_assets() -> Path | None:
    """The folder of Swagger UI's files in the installed `swagger-ui-py` package (found without
    importing it), or None when it is not installed."""
    spec = importlib.util.find_spec("swagger_ui")
    for root in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(root) / "static"
        if all((folder / name).is_file() for name in DOCS_ASSETS):
            return folder
    return None


def _targets(items: list[TargetIn] | None) -> list[Target] | None:
    if items is None:
        return None
    return [Target.from_dict(t.model_dump()) for t in items]


# Declared as security schemes, so the OpenAPI document lists them and /docs has an Authorize
# button; auto_error=False: a missing key is our own 401 below, with one message for both.
_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False,
                               description="An API key from `cep search key OWNER`.")
_bearer = HTTPBearer(auto_error=False, bearerFormat="cep_<key id>_<secret>",
                     description="The same API key, as `Authorization: Bearer cep_…`.")


def _owner(request: Request,
           bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None,
           x_api_key: Annotated[str | None, Security(_api_key_header)] = None) -> str:
    key = x_api_key
    if bearer is not None and bearer.credentials:
        key = bearer.credentials.strip()
    keys: ApiKeyStore = request.app.state.keys
    who = keys.owner_of(key) if key else None
    if who is None:
        raise HTTPException(401, "missing or invalid API key",
                            headers={"WWW-Authenticate": "Bearer"})
    return who


Owner = Annotated[str, Depends(_owner)]


def create_app(registry: SearchRegistry, keys: ApiKeyStore, *,
               max_body: int = DEFAULT_MAX_BODY) -> FastAPI:
    app = FastAPI(title="cep saved searches", version="1", docs_url=None, redoc_url=None,
                  description="Saved searches (percolator queries) per owner. Reference: "
                              "docs/api.md. Authorize with an API key from "
                              "`cep search key OWNER`.")

    app.state.keys = keys

    @app.exception_handler(QueryError)
    async def on_query_error(request: Request, exc: QueryError) -> JSONResponse:
        return JSONResponse(_query_error(exc), status_code=400)

    @app.exception_handler(SearchNotFound)
    async def on_not_found(request: Request, exc: SearchNotFound) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(SearchExists)
    async def on_exists(request: Request, exc: SearchExists) -> JSONResponse:
        # The same status and body whether the caller or another owner holds the id: it never
        # says whose it is or what it holds (docs/api.md, "Ids"). Only create raises this.
        taken = getattr(request.state, "search_id", None)
        return JSONResponse({"detail": ID_TAKEN.format(id=taken), "error": "id_not_available"},
                            status_code=409)

    @app.exception_handler(LimitExceeded)
    async def on_limit(request: Request, exc: LimitExceeded) -> JSONResponse:
        limit = registry.max_per_owner
        return JSONResponse({
            "detail": f"you have {limit:,} saved searches, the most one owner may have: delete "
                      "some (DELETE /v1/searches/{id}) before adding more",
            "error": "owner_limit", "limit": limit}, status_code=403)

    @app.exception_handler(InvalidSearch)
    async def on_invalid(request: Request, exc: InvalidSearch) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/searches")
    def list_searches(
        who: Owner,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="searches per page")]
        = DEFAULT_PAGE,
        after: Annotated[str | None, Query(max_length=1024, description=(
            "the `next` of the previous page: the searches whose id sorts after it"))] = None,
    ) -> dict[str, Any]:
        """The caller's searches in id order, `limit` at a time; `next` is the cursor of the
        following page (null on the last one). A cursor is an id, not a position: searches
        added or deleted between pages neither repeat nor shift the rest."""
        owned = registry.owned(who)  # sorted by id
        if after is not None:
            owned = [s for s in owned if s.id > after]
        page = owned[:limit]
        nxt = page[-1].id if len(owned) > limit else None
        return {"searches": [s.to_dict() for s in page], "next": nxt,
                "total": registry.store.count(who), "limit": limit}

    @app.post("/v1/searches", status_code=201)
    def create(body: SearchIn, who: Owner, request: Request) -> dict[str, Any]:
        request.state.search_id = body.id
        search = registry.add(who, body.query, search_id=body.id, metadata=body.metadata,
                              targets=_targets(body.targets) or ())
        return search.to_dict()

    @app.get("/v1/searches/{search_id}")
    def read(search_id: str, who: Owner) -> dict[str, Any]:
        return registry.get(who, search_id).to_dict()

    @app.put("/v1/searches/{search_id}")
    def change(search_id: str, body: SearchPatch, who: Owner) -> dict[str, Any]:
        search = registry.update(who, search_id, query=body.query, metadata=body.metadata,
                                 targets=_targets(body.targets))
        return search.to_dict()

    @app.delete("/v1/searches/{search_id}", status_code=204)
    def delete(search_id: str, who: Owner) -> Response:
        registry.remove(who, search_id)
        return Response(status_code=204)

    @app.post("/v1/test")
    def test(body: TestIn, who: Owner) -> dict[str, Any]:
        result = explain(body.query, body.event, registry.schema)
        return {**result.to_dict(), "explanation": result.render()}

    assets = _docs_assets()

    @app.get("/docs", include_in_schema=False)
    def docs(request: Request) -> HTMLResponse:
        if assets is None:
            raise HTTPException(501, "the Swagger UI files are not installed (pip install "
                                     "swagger-ui-py); /openapi.json has the API")
        return get_swagger_ui_html(
            # Under the app's mount point (the console mounts it at /search-api).
            openapi_url=request.scope.get("root_path", "").rstrip("/") + "/openapi.json",
            title=f"{app.title} — API",
            swagger_js_url="docs-assets/swagger-ui-bundle.js",
            swagger_css_url="docs-assets/swagger-ui.css",
            swagger_favicon_url="docs-assets/favicon-32x32.png",
            # validatorUrl null: no badge fetched from the validator service.
            swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": False})

    @app.get("/docs-assets/{name}", include_in_schema=False)
    def docs_asset(name: str) -> Response:
        if assets is None or name not in DOCS_ASSETS:
            raise HTTPException(404, "no such asset")
        return FileResponse(assets / name, headers={"Cache-Control": "public, max-age=86400"})

    app.add_middleware(BodyLimit, limit=max_body)  # type: ignore[arg-type]
    return app
