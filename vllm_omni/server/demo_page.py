"""The voice demo page (docs/demo.md): `GET /` and its assets under `/demo/`, all from the
package, so the page loads nothing from anywhere but this server. It needs no API key to
load; it asks for one when the server requires it."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

DEMO_DIR = Path(__file__).parent / "demo"


def add_demo_page(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def demo_page() -> FileResponse:
        return FileResponse(DEMO_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/demo", StaticFiles(directory=DEMO_DIR), name="demo")
