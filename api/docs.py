"""/docs: Swagger UI with its JavaScript, CSS and icon served by the API itself.

FastAPI's own /docs page loads Swagger UI from a public CDN, which an air-gapped cluster cannot
reach. Here the page is FastAPI's (`get_swagger_ui_html`), but every file it loads comes from the
`swagger-ui-bundle-v2` package (Swagger UI 5, which reads FastAPI's OpenAPI 3.1; its module is
`swagger_ui_bundle`), mounted under /docs/assets, so the page needs nothing but this API.
Like /openapi.json, none of it takes an API key. Redoc is not served: no package ships its script.
"""

from __future__ import annotations

from pathlib import Path

import swagger_ui_bundle
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_PATH = "/docs"
ASSETS_PATH = f"{DOCS_PATH}/assets"
# Swagger UI's dist folder, as the package installs it.
ASSETS_DIR = Path(str(swagger_ui_bundle.swagger_ui_path))


def install(app: FastAPI) -> None:
    """Serve /docs and its assets on `app` (made with `docs_url=None, redoc_url=None`)."""
    if app.openapi_url is None:
        raise ValueError("the docs need the OpenAPI schema: the app has no openapi_url")
    openapi_url = app.openapi_url
    title = f"{app.title} - Swagger UI"

    async def docs(request: Request) -> HTMLResponse:
        # Behind a proxy that strips a path prefix, the page's URLs keep it (as FastAPI's do).
        root = request.scope.get("root_path", "").rstrip("/")
        assets = root + ASSETS_PATH
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=title,
            swagger_js_url=f"{assets}/swagger-ui-bundle.js",
            swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=f"{assets}/favicon-32x32.png",
            # No badge from the public validator service either.
            swagger_ui_parameters={"validatorUrl": None},
        )

    app.add_api_route(DOCS_PATH, docs, methods=["GET"], include_in_schema=False)
    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_DIR), name="docs-assets")
