"""The running gateway: engine, quota store, policy, dispatcher and the grpc.aio server.

`running_gateway(settings)` is an async context manager that owns everything it starts;
`serve(settings)` runs one until cancelled (Ctrl-C, SIGTERM). Shutdown is graceful: health
turns NOT_SERVING, running RPCs get `settings.grace_s` to end, then calls still running are
cancelled, their engine blocks freed and their quota released, in that order.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import aio_server_interceptor
from opentelemetry.sdk.trace import TracerProvider

from engine import AsyncEngine, LLMEngine
from fairgate.v1 import admin_pb2, admin_pb2_grpc, gateway_pb2, gateway_pb2_grpc
from gateway.admin_service import AdminService
from gateway.calls import CallDefaults, CallPlanner
from gateway.dispatch import DispatchConfig, Dispatcher
from gateway.engine_setup import build_engine_core
from gateway.registry import JobRegistry
from gateway.service import GatewayService
from gateway.settings import Settings
from gateway.telemetry import setup_tracing, tracer
from predictor.anomaly import AnomalyGuard
from predictor.distribution import LengthDistribution
from predictor.history import HistoryPredictor
from predictor.prompt_model import HIDDEN_ARTIFACT, PromptModel
from tenants import MemoryQuotaStore, QuotaStore, RedisQuotaStore
from tenants.policies import make_policy

log = logging.getLogger(__name__)
SERVICES = (
    gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
)
# Prior of output lengths before a tenant has history (calls capped at 512 by default).
LENGTH_PRIOR = LengthDistribution(mean=160.0, p50=128.0, p90=320.0, p99=512.0)


@dataclass(slots=True)
class RunningGateway:
    settings: Settings
    port: int
    store: QuotaStore
    engine: AsyncEngine
    dispatcher: Dispatcher
    jobs: JobRegistry


def make_store(settings: Settings) -> QuotaStore:
    if settings.store == "memory":
        return MemoryQuotaStore()
    if settings.store.startswith(("redis://", "rediss://", "unix://")):
        return RedisQuotaStore(settings.store)
    raise ValueError(f"store must be 'memory' or a redis:// URL, got {settings.store!r}")


def server_options(settings: Settings) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


@contextlib.asynccontextmanager
async def running_gateway(
    settings: Settings,
    *,
    core: LLMEngine | None = None,
    store: QuotaStore | None = None,
    tracer_provider: TracerProvider | None = None,
) -> AsyncIterator[RunningGateway]:
    """Start a gateway; `core` and `store` replace the ones the settings would build. Spans go
    to `tracer_provider`; without one the gateway does no span work."""
    # The simulated engine's steps are instant: a thread hop would be all they cost
    instant = core is None and settings.simulated_engine
    if core is None:
        core = await anyio.to_thread.run_sync(build_engine_core, settings)
    store = store if store is not None else make_store(settings)
    jobs = JobRegistry()
    config = DispatchConfig(
        model_name=settings.model,
        reservation_ttl_s=settings.reservation_ttl_s,
        knee_calls=settings.knee_calls,
    )
    defaults = CallDefaults(
        settings.default_temperature, settings.default_top_p, settings.max_model_len
    )
    cold = PromptModel.load() if settings.length_predictor == "prompt" else None
    hidden_size = core.runner.hidden_size  # 0: the engine hands out no hidden states
    refiner = PromptModel.load(HIDDEN_ARTIFACT) if settings.hidden_refine and hidden_size else None
    if refiner is not None and refiner.hidden_size != hidden_size:
        raise ValueError(
            f"hidden_refine: {HIDDEN_ARTIFACT.name} takes hidden vectors of "
            f"{refiner.hidden_size}, the engine's model hands out {hidden_size}: set "
            "hidden_refine = false for this model"
        )
    history = HistoryPredictor(LENGTH_PRIOR, cold=cold)
    planner = CallPlanner(history, AnomalyGuard(), defaults, refiner)
    policy = make_policy(settings.policy)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(store.aclose)
        engine = await stack.enter_async_context(AsyncEngine(core, run_in_thread=not instant))
        dispatcher = await stack.enter_async_context(
            Dispatcher(
                engine,
                policy,
                store,
                core.tokenizer,
                planner,
                config,
                on_job_end=jobs.ended,
                tracer=tracer(tracer_provider) if tracer_provider is not None else None,
            )
        )
        server, health_servicer = _build_server(settings, store, jobs, dispatcher, tracer_provider)
        port = server.add_insecure_port(f"{settings.host}:{settings.port}")
        await server.start()
        for name in ("", *SERVICES):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        try:
            yield RunningGateway(settings, port, store, engine, dispatcher, jobs)
        finally:
            with anyio.CancelScope(shield=True):
                await health_servicer.enter_graceful_shutdown()
                await server.stop(settings.grace_s)
                for run in list(dispatcher.running_jobs()):
                    dispatcher.cancel(run, "server shutting down")


def _build_server(
    settings: Settings,
    store: QuotaStore,
    jobs: JobRegistry,
    dispatcher: Dispatcher,
    tracer_provider: TracerProvider | None,
) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    from gateway.auth import AuthInterceptor

    interceptors: list[grpc.aio.ServerInterceptor] = [AuthInterceptor(store, settings.admin_key)]
    if tracer_provider is not None:
        spans = aio_server_interceptor(tracer_provider=tracer_provider)  # type: ignore[no-untyped-call]
        interceptors.insert(0, spans)
    server = grpc.aio.server(interceptors=interceptors, options=server_options(settings))
    gateway_pb2_grpc.add_GatewayServicer_to_server(GatewayService(jobs, dispatcher, store), server)

    async def cancel_jobs_of(tenant_id: str) -> None:
        for run in dispatcher.running_jobs():
            if run.tenant_id == tenant_id:
                dispatcher.cancel(run, "tenant deleted")

    admin = AdminService(store, on_tenant_deleted=cancel_jobs_of)
    admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    return server, health_servicer


async def serve(settings: Settings) -> None:
    """Run a gateway until SIGINT or SIGTERM; traces go over OTLP when OTEL_* asks for it."""
    provider = setup_tracing()
    if provider is not None:
        trace.set_tracer_provider(provider)  # for any library that traces through the global one
    try:
        async with running_gateway(settings, tracer_provider=provider) as gateway:
            print(f"fairgate serving on {settings.host}:{gateway.port}", flush=True)
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    log.info("shutting down")
                    return
    finally:
        if provider is not None:
            provider.shutdown()
