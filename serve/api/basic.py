"""The endpoints that do not generate: GET /health, GET /v1/models (the one served model, vLLM's
ModelList) and GET /metrics (Prometheus text with vLLM's metric names: serve/api/metrics.py)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from eyas.serve.api.protocol import ModelCard, ModelList

router = APIRouter()


@router.get("/health")
async def health() -> Response:
    return Response(status_code=200)


@router.get("/v1/models", response_model=None)
async def models(request: HttpRequest) -> ModelList:
    served = request.app.state.served
    return ModelList(data=[ModelCard(id=served.name, root=served.root, max_model_len=served.max_model_len)])


@router.get("/metrics")
async def metrics(request: HttpRequest) -> Response:
    registry = request.app.state.served.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
