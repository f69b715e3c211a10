"""GET /v1/models and GET /v1/languages: what is served."""

from __future__ import annotations

from fastapi import APIRouter

from app.protocol import Language, LanguagePair, LanguagesResponse, ModelConfigSummary, ModelInfo, ModelsResponse
from app.routers import ServiceDep

router = APIRouter(tags=["models"])


@router.get("/v1/models", response_model=ModelsResponse, summary="Served models")
async def list_models(service: ServiceDep):
    workers = service.workers()
    alive = [w for w in workers if w.alive]
    return ModelsResponse(models=[
        ModelInfo(id=m.id, source=m.source, target=m.target, config=ModelConfigSummary(**m.config_summary()),
                  parameters=m.parameters, device=service.device_kind, dtype=service.dtype,
                  cpu_kernels=any(w.cpu_kernels for w in alive), fused=any(w.fused for w in alive),
                  int8_path=next((w.int8_path for w in alive if w.int8_path), None),
                  max_source_tokens=m.max_source_tokens, length_penalty=m.length_penalty,
                  loaded_on=[w.index for w in workers if m.id in w.loaded])
        for m in service.registry.models.values()])


@router.get("/v1/languages", response_model=LanguagesResponse, summary="Served languages and pairs")
async def list_languages(service: ServiceDep):
    registry = service.registry
    return LanguagesResponse(
        languages=[Language(code=c, name=n, targets=t) for c, n, t in registry.languages()],
        pairs=[LanguagePair(source=m.source, target=m.target, model=m.id) for m in registry.models.values()])
